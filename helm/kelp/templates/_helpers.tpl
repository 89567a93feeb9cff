{{/*
Names. Kubernetes names are DNS labels (63 characters); the longest suffix
the chart appends is "-trainer" / "-serving" / "-join" / "-dashboard".
*/}}
{{- define "kelp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kelp.fullname" -}}
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

{{- define "kelp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels. Call with (dict "root" $ "component" "trainer"); component may be "".
*/}}
{{- define "kelp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kelp.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "kelp.labels" -}}
helm.sh/chart: {{ include "kelp.chart" .root }}
{{ include "kelp.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kelp
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kelp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kelp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference. Call with (dict "root" $ "override" .Values.trainer.image).
*/}}
{{- define "kelp.image" -}}
{{- $img := .root.Values.image }}
{{- $repo := default $img.repository .override.repository }}
{{- $tag := default (default .root.Chart.AppVersion $img.tag) .override.tag }}
{{- if and $img.digest (not .override.repository) (not .override.tag) }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{- define "kelp.configPath" -}}/etc/kelp/kelp.yaml{{- end }}
{{- define "kelp.storeTlsDir" -}}/etc/kelp/tls/store{{- end }}
{{- define "kelp.kafkaTlsDir" -}}/etc/kelp/tls/kafka{{- end }}
{{- define "kelp.authDir" -}}/etc/kelp/auth{{- end }}

{{- define "kelp.servingPort" -}}
{{- (.Values.config.serving | default dict).port | default 8080 }}
{{- end }}

{{- define "kelp.metricsPort" -}}
{{- (.Values.config.metrics | default dict).port | default 9400 }}
{{- end }}

{{- define "kelp.joinPort" -}}
{{- (.Values.config.join | default dict).port | default 9410 }}
{{- end }}

{{/*
The trainer group (trainer.replicas > 1): every pod runs torchrun, whose c10d
rendezvous store is hosted by pod 0's torchrun. Pods are named through the
headless trainer Service (the StatefulSet's serviceName, publishNotReadyAddresses)
so pod 0 resolves before any pod is ready.
*/}}
{{- define "kelp.trainerGroup" -}}
{{- if gt (int .Values.trainer.replicas) 1 }}true{{ end }}
{{- end }}

{{- define "kelp.trainerService" -}}
{{- include "kelp.fullname" . }}-trainer
{{- end }}

{{/* The DNS domain of the trainer pods: <pod>.<this>. */}}
{{- define "kelp.trainerDomain" -}}
{{- printf "%s.%s.svc.%s" (include "kelp.trainerService" .) .Release.Namespace .Values.trainer.distributed.clusterDomain }}
{{- end }}

{{- define "kelp.trainerMinReplicas" -}}
{{- $min := .Values.trainer.distributed.minReplicas }}
{{- if eq (toString $min) "" }}{{ int .Values.trainer.replicas }}{{ else }}{{ int $min }}{{ end }}
{{- end }}

{{- define "kelp.rdzvEndpoint" -}}
{{- printf "%s-trainer-0.%s:%d" (include "kelp.fullname" .) (include "kelp.trainerDomain" .) (int .Values.trainer.distributed.rdzvPort) }}
{{- end }}

{{/*
Cross-field rules that values.schema.json cannot express well. Each message
names the value to change.
*/}}
{{- define "kelp.validate" -}}
{{- $cfg := .Values.config }}
{{- $store := $cfg.store | default dict }}
{{- if $store.password }}
{{- fail "config.store.password must not be set: config is rendered into a ConfigMap. Put the password in a Secret and set secrets.store.password.existingSecret (and .key)." }}
{{- end }}
{{- $sec := ($cfg.source | default dict).security | default dict }}
{{- if or $sec.sasl_password $sec.ssl_password }}
{{- fail "config.source.security.sasl_password / ssl_password must not be set: config is rendered into a ConfigMap. Use secrets.kafka.saslPassword / secrets.kafka.sslKeyPassword (existingSecret, key)." }}
{{- end }}
{{- if and (has ($sec.sasl_mechanism | default "") (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) (not .Values.secrets.kafka.saslPassword.existingSecret) }}
{{- fail (printf "config.source.security.sasl_mechanism %s needs a password: set secrets.kafka.saslPassword.existingSecret (and .key) and config.source.security.sasl_username." $sec.sasl_mechanism) }}
{{- end }}
{{- $kafkaTls := .Values.secrets.kafka.tls }}
{{- if and (or $kafkaTls.ca.existingSecret $kafkaTls.cert.existingSecret) (not (has ($sec.protocol | default "PLAINTEXT") (list "SSL" "SASL_SSL"))) }}
{{- fail "secrets.kafka.tls is set but config.source.security.protocol is not SSL or SASL_SSL." }}
{{- end }}
{{- range $what, $tls := dict "secrets.store.tls" .Values.secrets.store.tls "secrets.kafka.tls" .Values.secrets.kafka.tls }}
{{- if ne (empty $tls.cert.existingSecret) (empty $tls.key.existingSecret) }}
{{- fail (printf "%s: set both cert and key (client certificate and its private key), or neither." $what) }}
{{- end }}
{{- end }}
{{- $replicas := int .Values.trainer.replicas }}
{{- $dist := .Values.trainer.distributed }}
{{- if and (gt $replicas 1) (ne (toString $dist.minReplicas) "") (gt (int $dist.minReplicas) $replicas) }}
{{- fail (printf "trainer.distributed.minReplicas (%d) must not exceed trainer.replicas (%d)." (int $dist.minReplicas) $replicas) }}
{{- end }}
{{- if and (gt $replicas 1) (eq (int $dist.rdzvPort) (int (include "kelp.metricsPort" .))) }}
{{- fail (printf "trainer.distributed.rdzvPort (%d) must differ from config.metrics.port." (int $dist.rdzvPort)) }}
{{- end }}
{{- if .Values.join.enabled }}
{{- $join := $cfg.join | default dict }}
{{- if not $join.actions }}
{{- fail "join.enabled needs config.join.actions: at least one action topic ({topic, task, window_s}) for every label of config.features." }}
{{- end }}
{{- if and (eq ($store.backend | default "redis") "redis-cluster") (not $join.redis_url) (not .Values.secrets.join.redisUrl.existingSecret) }}
{{- fail "join.enabled with config.store.backend redis-cluster: the joiner keeps its waiting impressions in a standalone Redis; set config.join.redis_url (or secrets.join.redisUrl)." }}
{{- end }}
{{- end }}
{{- $hpa := .Values.serving.autoscaling }}
{{- if and $hpa.enabled (gt (int $hpa.minReplicas) (int $hpa.maxReplicas)) }}
{{- fail (printf "serving.autoscaling.minReplicas (%d) must not exceed maxReplicas (%d)." (int $hpa.minReplicas) (int $hpa.maxReplicas)) }}
{{- end }}
{{- end }}

{{/*
The Kelp config file: .Values.config plus the fields the chart owns (paths
that must match the mounts below).
*/}}
{{- define "kelp.config" -}}
{{- include "kelp.validate" . }}
{{- $cfg := deepCopy .Values.config }}
{{- if not $cfg.trainer }}{{- $_ := set $cfg "trainer" dict }}{{- end }}
{{- $_ := set $cfg.trainer "checkpoint_dir" .Values.trainer.checkpoints.mountPath }}
{{- $storeTls := .Values.secrets.store.tls }}
{{- if or $storeTls.ca.existingSecret $storeTls.cert.existingSecret }}
{{- if not $cfg.store.tls }}{{- $_ := set $cfg.store "tls" dict }}{{- end }}
{{- $_ := set $cfg.store.tls "enabled" true }}
{{- if $storeTls.ca.existingSecret }}
{{- $_ := set $cfg.store.tls "ca_file" (printf "%s/ca.crt" (include "kelp.storeTlsDir" .)) }}
{{- end }}
{{- if $storeTls.cert.existingSecret }}
{{- $_ := set $cfg.store.tls "cert_file" (printf "%s/tls.crt" (include "kelp.storeTlsDir" .)) }}
{{- $_ := set $cfg.store.tls "key_file" (printf "%s/tls.key" (include "kelp.storeTlsDir" .)) }}
{{- end }}
{{- end }}
{{- $kafkaTls := .Values.secrets.kafka.tls }}
{{- if and $cfg.source (or $kafkaTls.ca.existingSecret $kafkaTls.cert.existingSecret) }}
{{- if not $cfg.source.security }}{{- $_ := set $cfg.source "security" dict }}{{- end }}
{{- if $kafkaTls.ca.existingSecret }}
{{- $_ := set $cfg.source.security "ssl_cafile" (printf "%s/ca.crt" (include "kelp.kafkaTlsDir" .)) }}
{{- end }}
{{- if $kafkaTls.cert.existingSecret }}
{{- $_ := set $cfg.source.security "ssl_certfile" (printf "%s/tls.crt" (include "kelp.kafkaTlsDir" .)) }}
{{- $_ := set $cfg.source.security "ssl_keyfile" (printf "%s/tls.key" (include "kelp.kafkaTlsDir" .)) }}
{{- end }}
{{- end }}
{{- if .Values.secrets.serving.authToken.existingSecret }}
{{- if not $cfg.serving }}{{- $_ := set $cfg "serving" dict }}{{- end }}
{{- $_ := set $cfg.serving "auth_token_file" (printf "%s/token" (include "kelp.authDir" .)) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
Secrets as KELP_... config overrides (config/loader.py). The Kafka set goes to
the processes that talk to Kafka: the trainer, the joiner, and serving only
with config.serving.request_log on. The Redis credentials depend on the
workload: with secrets.store.trainerAuth / servingAuth / joinAuth set, the
trainer / serving / joiner pods log in as their own ACL user
(KELP_STORE__USERNAME and KELP_STORE__PASSWORD from that Secret); otherwise
every pod uses secrets.store.password. secrets.publisher.redisUrl (the snapshot
channel's own Redis, its URL with the password) goes to every pod,
secrets.join.redisUrl (the joiner's own Redis) to the joiner only.
Call with (dict "root" . "role" "trainer"|"serving"|"join"|"probe").
*/}}
{{- define "kelp.env" -}}
{{- $root := .root }}
{{- $auth := dict }}
{{- if eq .role "trainer" }}{{ $auth = $root.Values.secrets.store.trainerAuth }}{{ end }}
{{- if eq .role "serving" }}{{ $auth = $root.Values.secrets.store.servingAuth }}{{ end }}
{{- if eq .role "join" }}{{ $auth = $root.Values.secrets.store.joinAuth }}{{ end }}
- name: XDG_CACHE_HOME
  value: /tmp/.cache
{{- with $root.Values.pythonPath }}
- name: PYTHONPATH
  value: {{ . | quote }}
{{- end }}
{{- if $auth.existingSecret }}
- name: KELP_STORE__USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret | quote }}
      key: {{ $auth.usernameKey | quote }}
- name: KELP_STORE__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret | quote }}
      key: {{ $auth.passwordKey | quote }}
{{- end }}
{{- $refs := list
  (list "KELP_PUBLISHER__REDIS_URL" (($root.Values.secrets.publisher | default dict).redisUrl | default dict)) }}
{{- /* Serving pods talk to Kafka only to write the request log: without it they get no Kafka secret. */}}
{{- $requestLog := ((($root.Values.config.serving | default dict).request_log | default dict).enabled) | default false }}
{{- if eq .role "join" }}
{{- $refs = append $refs (list "KELP_JOIN__REDIS_URL" (($root.Values.secrets.join | default dict).redisUrl | default dict)) }}
{{- end }}
{{- if or (has .role (list "trainer" "join")) $requestLog }}
{{- $refs = concat (list
  (list "KELP_SOURCE__SECURITY__SASL_PASSWORD" $root.Values.secrets.kafka.saslPassword)
  (list "KELP_SOURCE__SECURITY__SSL_PASSWORD" $root.Values.secrets.kafka.sslKeyPassword)) $refs }}
{{- end }}
{{- if not $auth.existingSecret }}
{{- $refs = prepend $refs (list "KELP_STORE__PASSWORD" $root.Values.secrets.store.password) }}
{{- end }}
{{- range $refs }}
{{- $ref := index . 1 }}
{{- if $ref.existingSecret }}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.existingSecret | quote }}
      key: {{ $ref.key | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
TLS files from existing Secrets, projected into one directory per service.
Call with (dict "tls" .Values.secrets.store.tls "name" "store-tls").
*/}}
{{- define "kelp.tlsVolume" -}}
{{- if or .tls.ca.existingSecret .tls.cert.existingSecret -}}
- name: {{ .name }}
  projected:
    defaultMode: 0440
    sources:
      {{- range $file, $ref := dict "ca.crt" .tls.ca "tls.crt" .tls.cert "tls.key" .tls.key }}
      {{- if $ref.existingSecret }}
      - secret:
          name: {{ $ref.existingSecret | quote }}
          items:
            - key: {{ $ref.key | quote }}
              path: {{ $file }}
      {{- end }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "kelp.hasStoreTls" -}}
{{- if or .Values.secrets.store.tls.ca.existingSecret .Values.secrets.store.tls.cert.existingSecret }}true{{ end }}
{{- end }}

{{/*
The serving bearer token (secrets.serving.authToken) as a volume, and its mount.
*/}}
{{- define "kelp.authVolume" -}}
{{- with .Values.secrets.serving.authToken }}{{ if .existingSecret -}}
- name: serving-auth
  secret:
    secretName: {{ .existingSecret | quote }}
    defaultMode: 0440
    items:
      - key: {{ .key | quote }}
        path: token
{{- end }}{{ end }}
{{- end }}

{{- define "kelp.authMount" -}}
{{- if .Values.secrets.serving.authToken.existingSecret -}}
- name: serving-auth
  mountPath: {{ include "kelp.authDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "kelp.hasKafkaTls" -}}
{{- if or .Values.secrets.kafka.tls.ca.existingSecret .Values.secrets.kafka.tls.cert.existingSecret }}true{{ end }}
{{- end }}

{{- define "kelp.checksumConfig" -}}
checksum/config: {{ include "kelp.config" . | sha256sum }}
{{- end }}

{{/*
serving.replicas with the autoscaler on: the live Deployment's count (what the autoscaler chose),
kept within minReplicas..maxReplicas, or minReplicas when there is none yet (install, helm
template). Leaving replicas out instead would make an upgrade that switches the autoscaler on
reset the running Deployment to 1 replica (the field's default) until the autoscaler's next sync.
*/}}
{{- define "kelp.autoscaledServingReplicas" -}}
{{- $hpa := .Values.serving.autoscaling }}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (printf "%s-serving" (include "kelp.fullname" .)) }}
{{- $count := int $hpa.minReplicas }}
{{- if and $live $live.spec }}{{ $count = max $count (int $live.spec.replicas) }}{{ end }}
{{- min $count (int $hpa.maxReplicas) }}
{{- end }}

{{/*
A StatefulSet's volumeClaimTemplates cannot change once it exists. When the release's trainer
StatefulSet is live (lookup: helm install/upgrade, never helm template) and
trainer.checkpoints.persistence asks for other claims than it has, fail naming the values and the
way out, instead of the API server's "field is immutable" dump after part of the upgrade applied.
*/}}
{{- define "kelp.checkClaimTemplates" -}}
{{- $name := printf "%s-trainer" (include "kelp.fullname" .) }}
{{- $live := lookup "apps/v1" "StatefulSet" .Release.Namespace $name }}
{{- if and $live $live.spec }}
{{- $p := .Values.trainer.checkpoints.persistence }}
{{- $want := "none (emptyDir)" }}
{{- if $p.enabled }}
{{- $want = printf "size %v, storageClassName %q, accessModes %v" $p.size ($p.storageClassName | default "") $p.accessModes }}
{{- end }}
{{- $have := "none (emptyDir)" }}
{{- range ($live.spec.volumeClaimTemplates | default list) }}
{{- if eq .metadata.name "checkpoints" }}
{{- $have = printf "size %v, storageClassName %q, accessModes %v" .spec.resources.requests.storage (.spec.storageClassName | default "") .spec.accessModes }}
{{- end }}
{{- end }}
{{- if ne $want $have }}
{{- fail (printf "trainer.checkpoints.persistence cannot change on a running release: StatefulSet %s has checkpoint volumes %s, the values ask for %s, and a StatefulSet's volumeClaimTemplates are immutable. Keep the old values, or run `kubectl -n %s delete statefulset %s --cascade=orphan` (the pods keep running and their claims stay) and upgrade again; existing claims keep their size (resize them with `kubectl edit pvc` where the storage class allows expansion)." $name $have $want .Release.Namespace $name) }}
{{- end }}
{{- end }}
{{- end }}
