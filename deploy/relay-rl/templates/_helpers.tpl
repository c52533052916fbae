{{/* Names, labels and the pieces every pod shares. */}}

{{- define "relay-rl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "relay-rl.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "learner") */}}
{{- define "relay-rl.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "relay-rl.runId" -}}
{{- .Values.runId | default .Release.Name -}}
{{- end -}}

{{- define "relay-rl.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* Redis: host:port/db with no credentials, and the URL of one trusted user (password from $(REDIS_PASSWORD)) */}}
{{- define "relay-rl.redisUrl" -}}
{{- if .Values.redis.external.url -}}
{{- .Values.redis.external.url -}}
{{- else -}}
{{- printf "redis://%s-redis:6379/0" (include "relay-rl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "relay-rl.redisUserUrl" -}}
{{- $url := include "relay-rl.redisUrl" .root -}}
{{- $parts := splitList "://" $url -}}
{{- printf "%s://%s:$(REDIS_PASSWORD)@%s" (index $parts 0) .user (index $parts 1) -}}
{{- end -}}

{{- define "relay-rl.coordinatorUrl" -}}
{{- printf "https://%s-coordinator:%d" (include "relay-rl.fullname" .) (int .Values.coordinator.port) -}}
{{- end -}}

{{/* env: the Redis password of one trusted user, then RL_REDIS_URL built from it (dependent variable) */}}
{{- define "relay-rl.redisEnv" -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ include "relay-rl.fullname" .root }}-redis, key: {{ .user }}}
- name: RL_REDIS_URL
  value: {{ include "relay-rl.redisUserUrl" . | quote }}
{{- end -}}

{{/* env every Python service shares */}}
{{- define "relay-rl.commonEnv" -}}
- name: RL_RUN_CONFIG
  value: /etc/relay-rl/run.toml
- name: RL_RUN_ID
  value: {{ include "relay-rl.runId" . | quote }}
- name: RL_COORDINATOR_URL
  value: {{ include "relay-rl.coordinatorUrl" . | quote }}
{{- end -}}

{{- define "relay-rl.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef: {name: {{ include "relay-rl.fullname" .root }}-{{ .secret }}, key: {{ .key }}}
{{- end -}}

{{/* where the policy folder is inside a pod that does not build it itself */}}
{{- define "relay-rl.modelDir" -}}
{{- if eq .Values.model.source "volume" -}}
{{- printf "/models/%s" .Values.model.subPath | trimSuffix "/" -}}
{{- else -}}
/model
{{- end -}}
{{- end -}}

{{/* volumes of a pod that reads the run file and the policy folder */}}
{{- define "relay-rl.modelVolumes" -}}
- name: run-config
  configMap:
    name: {{ include "relay-rl.fullname" . }}-run-config
{{- if eq .Values.model.source "volume" }}
- name: models
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- else }}
- name: model
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "relay-rl.modelMounts" -}}
- name: run-config
  mountPath: /etc/relay-rl
  readOnly: true
{{- if eq .Values.model.source "volume" }}
- name: models
  mountPath: /models
  readOnly: true
{{- else }}
- name: model
  mountPath: /model
{{- end }}
{{- end -}}

{{/* init containers: build the tiny-random policy folder (source: init), then wait for the coordinator */}}
{{- define "relay-rl.modelInit" -}}
{{- if eq .Values.model.source "init" }}
- name: model-init
  image: {{ include "relay-rl.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["python", "-m", "services.learner.model_init", "--config", "/etc/relay-rl/run.toml", "--out", "/model"]
  volumeMounts:
    {{- include "relay-rl.modelMounts" . | nindent 4 }}
{{- end }}
{{- end -}}

{{- define "relay-rl.waitForCoordinator" -}}
- name: wait-for-coordinator
  image: {{ include "relay-rl.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import ssl, time, urllib.request
      url = "{{ include "relay-rl.coordinatorUrl" . }}/healthz"
      # only waits: no credential goes with it, so the certificate is not checked here (the worker checks it)
      unverified = ssl._create_unverified_context()
      while True:
          try:
              urllib.request.urlopen(url, timeout=2, context=unverified)
              break
          except OSError as exc:
              print(f"waiting for {url}: {exc}", flush=True)
              time.sleep(2)
{{- end -}}

{{- define "relay-rl.prometheusAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
