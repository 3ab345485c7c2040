// kstatus-check prints how kstatus (sigs.k8s.io/cli-utils, the library behind
// Flux's health checks, kpt and `kubectl` plugins) judges one Kubernetes object.
//
//	kstatus-check [FILE]        # FILE or stdin: one object, JSON or YAML
//
// Output, one JSON line on stdout: {"status": "Current|InProgress|Failed|
// Terminating|...", "message": "..."}. Exit 0 whenever a verdict was computed
// (whatever it is), 2 on unreadable input. See hack/kstatus/build.sh.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus-check: %v\n", err)
		os.Exit(2)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	var data []byte
	var err error
	switch len(args) {
	case 0:
		data, err = io.ReadAll(stdin)
	case 1:
		if args[0] == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(args[0])
		}
	default:
		return fmt.Errorf("usage: kstatus-check [FILE]  (one object, JSON or YAML; stdin when absent)")
	}
	if err != nil {
		return err
	}
	// YAML is a superset of JSON: one path for both. apimachinery's decoder
	// keeps whole numbers int64, as unstructured's accessors (generation,
	// observedGeneration) require; encoding/json would make them float64.
	asJSON, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("decoding the object: %w", err)
	}
	obj := map[string]interface{}{}
	if err := utiljson.Unmarshal(asJSON, &obj); err != nil {
		return fmt.Errorf("decoding the object: %w", err)
	}
	if len(obj) == 0 {
		return fmt.Errorf("no object on input")
	}
	result, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		return fmt.Errorf("computing the status: %w", err)
	}
	return json.NewEncoder(stdout).Encode(verdict{Status: result.Status.String(), Message: result.Message})
}
