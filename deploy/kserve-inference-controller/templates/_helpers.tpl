{{/* Chart name, overridable. */}}
{{- define "ksc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Object name prefix: <release>-<chart>, or the release name when it already
contains the chart name. Cut to 50 so that suffixes such as "-runner" and
"-metrics" keep every name a valid DNS label.
*/}}
{{- define "ksc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Cluster-scoped objects are named after the release *and* its namespace, so two
releases of the same name in different namespaces never share a ClusterRole.
*/}}
{{- define "ksc.clusterName" -}}
{{- printf "%s-%s" (include "ksc.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "ksc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ksc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ksc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ksc.labels" -}}
helm.sh/chart: {{ include "ksc.chart" . }}
{{ include "ksc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kserve-inference-controller
{{- end }}

{{/* Labels of the controller's own objects (component=controller). */}}
{{- define "ksc.controllerLabels" -}}
{{ include "ksc.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "ksc.controllerSelectorLabels" -}}
{{ include "ksc.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Labels of the runner's ServiceAccounts and Roles (component=runner). */}}
{{- define "ksc.runnerLabels" -}}
{{ include "ksc.labels" . }}
app.kubernetes.io/component: runner
{{- end }}

{{- define "ksc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ksc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ksc.runnerServiceAccountName" -}}
{{- default (printf "%s-runner" (include "ksc.fullname" .)) .Values.runner.serviceAccount.name }}
{{- end }}

{{- define "ksc.leaseName" -}}
{{- default (include "ksc.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "ksc.metricsServiceName" -}}
{{- printf "%s-metrics" (include "ksc.fullname" .) }}
{{- end }}

{{- define "ksc.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Namespaces where runner pods execute, as a JSON list: the watched namespaces
(or the release namespace when watching all), plus runner.namespaces.
*/}}
{{- define "ksc.runnerNamespaces" -}}
{{- $namespaces := list }}
{{- if .Values.watchNamespaces }}
{{- $namespaces = concat $namespaces .Values.watchNamespaces }}
{{- else }}
{{- $namespaces = append $namespaces .Release.Namespace }}
{{- end }}
{{- $namespaces = concat $namespaces .Values.runner.namespaces }}
{{- $namespaces | uniq | toJson }}
{{- end }}

{{/*
PromQL label matcher selecting this release's controller pods as scraped
through the metrics Service (the Prometheus Operator sets job=<service>).
*/}}
{{- define "ksc.promSelector" -}}
{{- printf "job=%q,namespace=%q" (include "ksc.metricsServiceName" .) .Release.Namespace }}
{{- end }}

{{/*
The run metrics (kserve_inference_runs*) carry the run's own label `namespace`.
With serviceMonitor.honorLabels false (the default) the target's namespace
wins and Prometheus keeps the run's as exported_namespace; with honorLabels
true the run's namespace is stored as `namespace` and the target's is gone.
"ksc.runSelector": the matcher selecting this release's run series.
"ksc.runNamespaceLabel": the label holding the run's namespace.
*/}}
{{- define "ksc.runSelector" -}}
{{- if .Values.serviceMonitor.honorLabels }}
{{- printf "job=%q" (include "ksc.metricsServiceName" .) }}
{{- else }}
{{- include "ksc.promSelector" . }}
{{- end }}
{{- end }}

{{- define "ksc.runNamespaceLabel" -}}
{{- ternary "namespace" "exported_namespace" (.Values.serviceMonitor.honorLabels | default false) }}
{{- end }}

{{/*
The controller's permissions on the objects it manages, shared by the
ClusterRole (all namespaces) and the per-namespace Roles. No Secrets: the
controller never reads one (runners do, with their own identity).
*/}}
{{- define "ksc.controllerRules" -}}
- apiGroups: ["ai.krateo.io"]
  resources: ["inferenceruns"]
  # delete: autoDeletePolicy removes finished one-shot runs.
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["ai.krateo.io"]
  resources: ["inferenceruns/status"]
  verbs: ["get", "update", "patch"]
- apiGroups: ["ai.krateo.io"]
  resources: ["inferenceconfigs"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ai.krateo.io"]
  resources: ["inferenceconfigs/status"]
  verbs: ["get", "update", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs", "cronjobs"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  # Live progress comes from the tail of the runner pod's log.
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  # list: a Job that cannot create its pods says why only in its FailedCreate Events.
  verbs: ["create", "patch", "list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.inferenceServices.enabled }}
- apiGroups: ["serving.kserve.io"]
  # spec.kserve.inferenceServiceRef: the model's URL, protocol and readiness.
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end }}

{{/*
Sharding by namespace (sharding.shards, docs/sharding.md).
"ksc.shards": the number of shards. The others take a shard as
dict "index" i "count" n (with a list of the root context and it for names).
*/}}
{{- define "ksc.shards" -}}
{{- (.Values.sharding).shards | default 1 | int }}
{{- end }}

{{/* The controller's Deployment (and PDB) of a shard: <fullname>, or <fullname>-shard-<i>. */}}
{{- define "ksc.shardName" -}}
{{- $root := index . 0 }}
{{- $shard := index . 1 }}
{{- if gt (int $shard.count) 1 }}
{{- printf "%s-shard-%d" (include "ksc.fullname" $root) (int $shard.index) }}
{{- else }}
{{- include "ksc.fullname" $root }}
{{- end }}
{{- end }}

{{/* The label telling a shard's pods from the others' (selectors, anti-affinity, scrape). */}}
{{- define "ksc.shardLabel" -}}
ai.krateo.io/controller-shard: {{ .index | toString | quote }}
{{- end }}

{{/* The controller's environment of a shard. */}}
{{- define "ksc.shardEnv" -}}
# This pod's shard: the namespaces it handles, and its Lease.
- name: SHARD_COUNT
  value: {{ .count | toString | quote }}
- name: SHARD_INDEX
  value: {{ .index | toString | quote }}
{{- end }}

{{/* The Lease of a shard, as controller/sharding.py names it: <lease>-shard-<i>-of-<n>. */}}
{{- define "ksc.shardLeaseName" -}}
{{- $root := index . 0 }}
{{- $shard := index . 1 }}
{{- if gt (int $shard.count) 1 }}
{{- printf "%s-shard-%d-of-%d" (include "ksc.leaseName" $root) (int $shard.index) (int $shard.count) }}
{{- else }}
{{- include "ksc.leaseName" $root }}
{{- end }}
{{- end }}

{{/* Every Lease of the release, as a JSON list: one per shard. */}}
{{- define "ksc.leaseNames" -}}
{{- $shards := include "ksc.shards" . | int }}
{{- $names := list }}
{{- range $index := until $shards }}
{{- $names = append $names (include "ksc.shardLeaseName" (list $ (dict "index" $index "count" $shards))) }}
{{- end }}
{{- $names | toJson }}
{{- end }}

{{/*
Seconds in a duration value: an integer (seconds) or a Go duration such as
30s, 1m30s, 1.5h (values.schema.json has already checked the shape).
*/}}
{{- define "ksc.seconds" -}}
{{- $value := toString . -}}
{{- if regexMatch "^[0-9]+$" $value -}}
{{- $value -}}
{{- else -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" $value -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $number (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end }}
