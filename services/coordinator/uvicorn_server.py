"""The coordinator's uvicorn server. Told to stop, it first answers every open long poll (GET
/v1/weights/latest: a 204, "nothing newer", which a worker simply asks again), and only then waits for the
connections to close. Uvicorn alone would hold the stop for its graceful timeout with a fleet long-polling,
then cut those requests off."""

from __future__ import annotations

import socket

import uvicorn
from fastapi import FastAPI

from services.coordinator.routers.weights import release_long_polls


class CoordinatorServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.coordinator_app = app  # config.app may be a layer in front of it

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        release_long_polls(self.coordinator_app)
        await super().shutdown(sockets)
