{{/* The chart's name, and the release's full name (both at most 63 characters). */}}
{{- define "eagle3-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eagle3-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object; selectorLabels select the operator's pod. */}}
{{- define "eagle3-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "eagle3-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "eagle3-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eagle3-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "eagle3-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "eagle3-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's RBAC rules: files/rbac-rules.yaml, generated from eagle3_operator/rbac.py by `make chart`. */}}
{{- define "eagle3-operator.rules" -}}
{{- .Files.Get "files/rbac-rules.yaml" | fromYaml | toJson }}
{{- end }}
