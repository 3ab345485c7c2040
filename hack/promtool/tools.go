//go:build tools

// Package tools pins promtool's module (github.com/prometheus/prometheus) in
// go.mod/go.sum; build.sh builds its cmd/promtool.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
