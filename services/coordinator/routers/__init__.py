"""The HTTP layer, one module per resource: path functions, their dependencies (services/coordinator/deps.py)
and error docs; what they answer is computed in the modules named for it.

    workers.py     /v1/workers: register, heartbeat (the FastAPI fallback of heartbeat_path.py), get, list,
                   drain, deregister
    trust.py       /v1/workers/{id}/release: an admin releases a quarantined worker (quarantine.py)
    operators.py   /v1/operators: join credentials an admin issues, lists and revokes (operators.py)
    status.py      /v1/staleness, /v1/status                    (answers: run_view.py)
    broadcast.py   /v1/broadcast/plan, /v1/workers/{id}/parent, /v1/broadcast/times
                                                                (relay_view.py, broadcast_times.py)
    control.py     /v1/capacity, /v1/activation, /v1/cost, /dashboard, /v1/dashboard, /metrics
                                                                (control.py, run_view.py, prometheus.py)

/healthz, the process's liveness, is the app's own (app.py).
"""
