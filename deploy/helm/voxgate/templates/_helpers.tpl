{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "voxgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; leaves room for the "-headless" / "-envoy" suffixes. */}}
{{- define "voxgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "voxgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "voxgate.labels" -}}
helm.sh/chart: {{ include "voxgate.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: voxgate
{{- end }}

{{/* Selector labels of the gateway pods. */}}
{{- define "voxgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "voxgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* Selector labels of the Envoy pods. */}}
{{- define "voxgate.envoySelectorLabels" -}}
app.kubernetes.io/name: {{ include "voxgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: envoy
{{- end }}

{{- define "voxgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "voxgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The gRPC health service name the probes and Envoy check (gateway.server.SERVICE_NAME). */}}
{{- define "voxgate.healthService" -}}
voxgate.v1.VoiceGateway
{{- end }}

{{/* DNS name of the headless Service: one A record per ready gateway pod. */}}
{{- define "voxgate.headlessHost" -}}
{{ include "voxgate.fullname" . }}-headless.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}
