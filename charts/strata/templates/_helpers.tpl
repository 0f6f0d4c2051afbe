{{/* Names and labels shared by every template. */}}

{{- define "strata.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name; a release already called "strata…" is not doubled ("strata-strata"). */}}
{{- define "strata.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* managed-by is Helm's here; objects the operator creates carry managed-by: strata instead. */}}
{{- define "strata.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: strata
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "strata.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository[:tag][@digest] for an image block; the tag defaults to the chart's appVersion. */}}
{{- define "strata.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- $ref := printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $ref $image.digest -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* More than one replica needs kopf peering; one replica runs standalone (no peering object needed). */}}
{{- define "strata.peering" -}}
{{- if gt (int .Values.replicaCount) 1 -}}{{ .Values.peering.name }}{{- end -}}
{{- end -}}

{{/* The pull secrets' names, comma-separated, for the operator to put into the pods it creates. */}}
{{- define "strata.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/*
The webhook configurations whose caBundle the operator keeps (webhook.tls.managedBy=operator), as Kind/name.
*/}}
{{- define "strata.webhookConfigurations" -}}
{{- $fullname := include "strata.fullname" . -}}
MutatingWebhookConfiguration/{{ $fullname }}-pod-wiring
{{- if .Values.webhook.protectInUse -}}
,ValidatingWebhookConfiguration/{{ $fullname }}-cache-deletion
{{- end -}}
{{- end }}
