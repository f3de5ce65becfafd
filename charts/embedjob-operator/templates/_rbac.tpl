{{/*
The RBAC rules of the operator: exactly what the controller and kopf call, nothing
with "*". files/rbac-rules.json is the output of `python -m controller.permissions`
(controller/permissions.py); tests/test_chart.py fails when it is stale and checks the
rendered (Cluster)Roles against it.
*/}}

{{/* clusterwide: {clusterRole}; namespaced: {clusterRole, role} */}}
{{- define "embedjob-operator.rbacRules" -}}
{{- $document := .Files.Get "files/rbac-rules.json" | fromJson -}}
{{- index $document (ternary "clusterwide" "namespaced" (empty .Values.watchNamespaces)) | toJson -}}
{{- end -}}

{{- define "embedjob-operator.subjects" -}}
- kind: ServiceAccount
  name: {{ include "embedjob-operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}
