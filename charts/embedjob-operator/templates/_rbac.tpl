{{/*
The RBAC rules of the operator: exactly what the controller calls, as listed in
controller/permissions.py (tests/test_chart.py checks the rendered rules against
it). Nothing with "*".
*/}}

{{/* Rules on namespaced resources: granted in each watched namespace, or cluster-wide. */}}
{{- define "embedjob-operator.namespacedRules" -}}
- apiGroups: ["embedjob.dev"]
  resources: ["embeddingjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["embedjob.dev"]
  resources: ["embeddingjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
{{- end -}}

{{/* Cluster-scoped reads kopf needs in every mode. */}}
{{- define "embedjob-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* Cluster-scoped reads kopf needs only when it watches all namespaces. */}}
{{- define "embedjob-operator.clusterWideRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end -}}

{{- define "embedjob-operator.subjects" -}}
- kind: ServiceAccount
  name: {{ include "embedjob-operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}
