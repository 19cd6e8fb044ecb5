{{/* The chart's name, and the release's full name (both at most 63 characters): the release name alone when it
  contains the chart's name (release eagle3-operator: eagle3-operator), else RELEASE-eagle3-operator. */}}
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

{{/* Labels of every object (commonLabels included); selectorLabels select the operator's pods. */}}
{{- define "eagle3-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "eagle3-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
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

{{/* An image reference from one of the image values (image, pipelineImage, pipelineCpuImage):
  [REGISTRY/]REPOSITORY@DIGEST when a digest is set (it wins over the tag), else [REGISTRY/]REPOSITORY:TAG.
  REGISTRY: the image's own registry, else global.imageRegistry. Call with
  (dict "image" VALUE "global" .Values.global "tag" DEFAULT_TAG). */}}
{{- define "eagle3-operator.image" -}}
{{- $registry := .image.registry | default (.global | default dict).imageRegistry | default "" | trimSuffix "/" }}
{{- $repository := .image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" $registry $repository }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.image.tag | default .tag) }}
{{- end }}
{{- end }}

{{/* The operator's image; the stage Jobs' image (pipelineImage) and its CPU variant (pipelineCpuImage: by default
  the same repository with the tag suffixed -cpu) for `eagle3 operator --pipeline-image/--pipeline-cpu-image`. */}}
{{- define "eagle3-operator.operatorImage" -}}
{{- include "eagle3-operator.image" (dict "image" .Values.image "global" .Values.global "tag" .Chart.AppVersion) }}
{{- end }}

{{- define "eagle3-operator.pipelineImage" -}}
{{- include "eagle3-operator.image" (dict "image" .Values.pipelineImage "global" .Values.global "tag" .Chart.AppVersion) }}
{{- end }}

{{- define "eagle3-operator.vllmImage" -}}
{{- include "eagle3-operator.image" (dict "image" .Values.vllmImage "global" .Values.global "tag" .Values.vllmImage.tag) }}
{{- end }}

{{- define "eagle3-operator.pipelineCpuImage" -}}
{{- $gpu := .Values.pipelineImage }}
{{- $cpu := .Values.pipelineCpuImage }}
{{- $image := dict "registry" ($cpu.registry | default $gpu.registry) "repository" ($cpu.repository | default $gpu.repository) "digest" $cpu.digest "tag" $cpu.tag }}
{{- $tag := printf "%s-cpu" ($gpu.tag | default .Chart.AppVersion) }}
{{- include "eagle3-operator.image" (dict "image" $image "global" .Values.global "tag" $tag) }}
{{- end }}
