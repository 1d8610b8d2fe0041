{{/* Names and labels ------------------------------------------------------------------------ */}}

{{- define "orchestrator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "orchestrator.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "orchestrator.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "orchestrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "web") */}}
{{- define "orchestrator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "orchestrator.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "orchestrator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Environment --------------------------------------------------------------------------- */}}

{{/* Host names Django answers to: the Ingress hosts, the Service's in-cluster names (Prometheus,
other services) and localhost (the kubelet's probes send Host: localhost). */}}
{{- define "orchestrator.allowedHosts" -}}
{{- $web := printf "%s-web" (include "orchestrator.fullname" .) -}}
{{- $hosts := list "localhost" $web (printf "%s.%s" $web .Release.Namespace) (printf "%s.%s.svc" $web .Release.Namespace) (printf "%s.%s.svc.%s" $web .Release.Namespace .Values.clusterDomain) -}}
{{- if .Values.ingress.enabled -}}
{{- range .Values.ingress.hosts -}}{{- $hosts = append $hosts . -}}{{- end -}}
{{- end -}}
{{- range .Values.allowedHosts -}}{{- $hosts = append $hosts . -}}{{- end -}}
{{- join "," (uniq $hosts) -}}
{{- end -}}

{{- define "orchestrator.csrfTrustedOrigins" -}}
{{- $origins := list -}}
{{- if .Values.ingress.enabled -}}
{{- range .Values.ingress.hosts -}}{{- $origins = append $origins (printf "https://%s" .) -}}{{- end -}}
{{- end -}}
{{- join "," $origins -}}
{{- end -}}

{{/* What every process gets: credentials from the existing Secret (never in values), the
HTTPS settings, and every ORCHESTRATOR_* setting of .Values.config. Pass (dict "root" $ "extra" map)
to override or add settings for one Deployment. */}}
{{- define "orchestrator.env" -}}
{{- $root := .root -}}
{{- $secret := $root.Values.secret -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.databaseUrl | quote }}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.redisUrl | quote }}}
- name: SECRET_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret.name | quote }}, key: {{ $secret.keys.secretKey | quote }}}
- name: DEBUG
  value: "false"
- name: ALLOWED_HOSTS
  value: {{ include "orchestrator.allowedHosts" $root | quote }}
- name: CSRF_TRUSTED_ORIGINS
  value: {{ include "orchestrator.csrfTrustedOrigins" $root | quote }}
- name: SECURE_PROXY_SSL_HEADER
  value: {{ $root.Values.https.proxySslHeader | quote }}
- name: SECURE_SSL_REDIRECT
  value: {{ $root.Values.https.sslRedirect | quote }}
- name: SESSION_COOKIE_SECURE
  value: "true"
- name: CSRF_COOKIE_SECURE
  value: "true"
- name: SECURE_HSTS_SECONDS
  value: {{ include "orchestrator.envValue" $root.Values.https.hstsSeconds | quote }}
- name: SECURE_HSTS_INCLUDE_SUBDOMAINS
  value: {{ $root.Values.https.hstsIncludeSubdomains | quote }}
- name: SECURE_HSTS_PRELOAD
  value: {{ $root.Values.https.hstsPreload | quote }}
- name: LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
- name: ORCHESTRATOR_SPOOL_DIR
  value: /app/var/spool
{{- $config := merge (default dict .extra) $root.Values.config }}
{{- if $root.Values.outputVolume.claimName }}
{{- $_ := set $config "ORCHESTRATOR_TASK_OUTPUT_DIR" $root.Values.outputVolume.mountPath }}
{{- end }}
{{- range $name := keys $config | sortAlpha }}
- name: {{ $name }}
  value: {{ include "orchestrator.envValue" (index $config $name) | quote }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A value as an environment variable's text: whole numbers without an exponent (YAML numbers
reach templates as floats, and 31536000 would print as 3.1536e+07). */}}
{{- define "orchestrator.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Pods ---------------------------------------------------------------------------------- */}}

{{- define "orchestrator.podSpecCommon" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The writable places of a read-only root filesystem: /tmp and the app's var/ (the worker's
spool of undelivered reports lives there; it survives a container restart, not the pod). */}}
{{- define "orchestrator.scratchVolumes" -}}
- name: tmp
  emptyDir: {}
- name: var
  emptyDir: {}
{{- end -}}

{{- define "orchestrator.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: var
  mountPath: /app/var
{{- end -}}

{{/* The output store's volume (outputVolume.claimName), in the pods that write, serve or delete
its files: workers, web, scheduler. Nothing without a claim. */}}
{{- define "orchestrator.outputVolumes" -}}
{{- if .Values.outputVolume.claimName }}
- name: task-output
  persistentVolumeClaim:
    claimName: {{ .Values.outputVolume.claimName | quote }}
{{- end }}
{{- end -}}

{{- define "orchestrator.outputMounts" -}}
{{- if .Values.outputVolume.claimName }}
- name: task-output
  mountPath: {{ .Values.outputVolume.mountPath | quote }}
{{- end }}
{{- end -}}

{{/* With migrations.waitForMigrations, a pod starts only once the database has every
migration of its image: the order holds even where Helm hooks do not run (GitOps tools). */}}
{{- define "orchestrator.waitForMigrations" -}}
{{- if .Values.migrations.waitForMigrations }}
- name: wait-for-migrations
  image: {{ include "orchestrator.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-c", "until python manage.py migrate --check >/dev/null; do echo 'waiting for the database migrations'; sleep 5; done"]
  env:
    {{- include "orchestrator.env" (dict "root" .) | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml .Values.migrations.resources | nindent 4 }}
  volumeMounts:
    {{- include "orchestrator.scratchMounts" . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* Probe of a process's own heartbeat: (dict "root" $ "process" "worker" "maxAge" 30 "ready" true) */}}
{{- define "orchestrator.heartbeatProbe" -}}
exec:
  command:
    - python
    - manage.py
    - check_alive
    - {{ .process }}
    - --max-age={{ .maxAge }}
    {{- if .ready }}
    - --ready
    {{- end }}
{{- end -}}

{{/* Workers ------------------------------------------------------------------------------- */}}

{{/* The worker container's securityContext. With a task user, the worker runs as root, because
switching a task process to another user takes root, but keeps only the capabilities it uses:
SETUID and SETGID to switch, KILL to signal task processes of another uid, CHOWN to give each
attempt a directory of its own, FOWNER and DAC_OVERRIDE to remove that directory with whatever
the task left in it. The rest stays as every container has it: no privilege escalation (no
setuid binary gives more back), a read-only root filesystem, the pod's group (runAsGroup).
Without a task user the tasks run as the worker, so it stays the image's unprivileged user. */}}
{{- define "orchestrator.workerSecurityContext" -}}
{{- $context := deepCopy .Values.securityContext -}}
{{- if .Values.workerPod.taskUser -}}
{{- $_ := set $context "runAsUser" 0 -}}
{{- $_ := set $context "runAsNonRoot" false -}}
{{- $_ := set $context "capabilities" (dict "drop" (list "ALL") "add" (list "SETUID" "SETGID" "KILL" "CHOWN" "FOWNER" "DAC_OVERRIDE")) -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}

{{/* A worker probe: a GET of the worker's own health endpoint (orchestrator/worker/host/health.py),
made by the kubelet. An exec probe would start a process in the container with its whole
environment (the database's password, SECRET_KEY), readable by a task of the same uid. */}}
{{- define "orchestrator.workerProbe" -}}
httpGet:
  path: {{ .path }}
  port: health
{{- end -}}

{{/* A worker's shutdown grace: its own shutdownGrace, else ORCHESTRATOR_WORKER_SHUTDOWN_GRACE. */}}
{{- define "orchestrator.workerShutdownGrace" -}}
{{- $grace := .root.Values.config.ORCHESTRATOR_WORKER_SHUTDOWN_GRACE -}}
{{- if hasKey .worker "shutdownGrace" }}{{ $grace = .worker.shutdownGrace }}{{ end -}}
{{- ceil (float64 $grace) | int -}}
{{- end -}}

{{/* terminationGracePeriodSeconds of a worker pod: its shutdown grace, then the longest
kill_grace a task may have (SIGTERM to SIGKILL), then a margin for the report to reach the
database. Shorter, and the kubelet's SIGKILL would turn a worker_termination into worker_lost. */}}
{{- define "orchestrator.workerTerminationGrace" -}}
{{- $root := .root -}}
{{- $kill := max (ceil (float64 $root.Values.config.ORCHESTRATOR_KILL_GRACE) | int) (int $root.Values.shutdown.maxTaskKillGrace) -}}
{{- add (include "orchestrator.workerShutdownGrace" .) $kill (int $root.Values.shutdown.margin) -}}
{{- end -}}

{{/* The KEDA query of one worker entry, from files/worker-demand.sql (the one place it lives).
Queue names are checked by values.schema.json ([A-Za-z0-9_.:-]), so quoting them is enough. */}}
{{- define "orchestrator.workerDemandQuery" -}}
{{- $queues := list -}}
{{- range .worker.queues }}{{ $queues = append $queues (printf "'%s'" .) }}{{ end -}}
{{- $sql := .root.Files.Get "files/worker-demand.sql" -}}
{{- $lines := list -}}
{{- range splitList "\n" $sql }}{{ if and (ne (trim .) "") (not (hasPrefix "--" (trim .))) }}{{ $lines = append $lines (trim .) }}{{ end }}{{ end -}}
{{- join " " $lines | replace "QUEUES" (join ", " $queues) | replace "CONCURRENCY" (toString (int .worker.concurrency)) -}}
{{- end -}}

{{/* Every worker pool: the workers entries, then the high-memory pool when it is enabled (its
memory request and limit computed: concurrency x maxTaskMemoryMiB + workerMemoryMiB, so that
tasks within their own memory_limit can never run its container out of memory together). As
YAML {"workers": [...]}: read it with `include "orchestrator.workers" . | fromYaml`. A pool's
name must be unique, and the high-memory pool's queues its own. */}}
{{- define "orchestrator.workers" -}}
{{- $all := list -}}
{{- range .Values.workers }}{{ $all = append $all . }}{{ end -}}
{{- $big := .Values.highMemoryWorkers -}}
{{- if $big.enabled -}}
{{- range $worker := .Values.workers -}}
{{- if eq $worker.name $big.name }}{{ fail (printf "highMemoryWorkers.name %q is also the name of a workers entry" $big.name) }}{{ end -}}
{{- range $big.queues -}}
{{- if has . $worker.queues }}{{ fail (printf "highMemoryWorkers.queues: %q is also a queue of workers %q; the high-memory pool needs queues of its own" . $worker.name) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $memory := printf "%dMi" (add (mul (int $big.concurrency) (int $big.maxTaskMemoryMiB)) (int $big.workerMemoryMiB)) -}}
{{- $entry := dict "name" $big.name "queues" $big.queues "concurrency" $big.concurrency "replicas" $big.replicas "minReplicas" $big.minReplicas "maxReplicas" $big.maxReplicas -}}
{{- $_ := set $entry "resources" (dict "requests" (dict "cpu" $big.cpu "memory" $memory) "limits" (dict "memory" $memory)) -}}
{{- range $key := list "shutdownGrace" "pdbMaxUnavailable" "affinity" "nodeSelector" "tolerations" -}}
{{- if and (hasKey $big $key) (not (kindIs "invalid" (index $big $key))) }}{{ $_ := set $entry $key (index $big $key) }}{{ end -}}
{{- end -}}
{{- $all = append $all $entry -}}
{{- end -}}
{{- toYaml (dict "workers" $all) -}}
{{- end -}}
