"""Deployment helpers shipped with the service: the container healthchecks
(`python -m kernelsearch.service.deploy.healthcheck api|worker`), the per-GPU compose override generator
(`python -m kernelsearch.service.deploy.gpu_workers`), and the files Compose reads beside them
(`worker-host.yml`, `env.example`)."""
