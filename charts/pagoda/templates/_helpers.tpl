{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "pagoda.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, suffixed with the chart name unless it already contains it. */}}
{{- define "pagoda.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "pagoda.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pagoda.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pagoda
{{- end }}

{{/* Selector labels of the operator: nothing version-dependent. */}}
{{- define "pagoda.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagoda.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "pagoda.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pagoda.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference: digest wins over tag; the tag defaults to the appVersion. */}}
{{- define "pagoda.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Runbook link of one alert: the base URL plus the alert's anchor in docs/alerts.md. */}}
{{- define "pagoda.runbook" -}}
{{- printf "%s#%s" (trimSuffix "/" .root.Values.prometheusRule.runbookBaseUrl) (lower .alert) }}
{{- end }}

{{/* The Lease the operator's replicas elect their leader on (operator/kube/leader.py), in the release's namespace. */}}
{{- define "pagoda.leaderLease" -}}
{{- printf "%s-leader" (include "pagoda.fullname" .) -}}
{{- end }}

{{/* The Secret holding the operator's management key (operator/kube/management.py), in the release's namespace. */}}
{{- define "pagoda.managementKeySecret" -}}
{{- printf "%s-management-key" (include "pagoda.fullname" .) -}}
{{- end }}
