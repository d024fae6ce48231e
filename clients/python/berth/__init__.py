"""berth: a typed client for the berth controller, and (``berth.osworld``) an OSWorld provider.

    import berth
    client = berth.Client()                      # BERTH_URL, BERTH_API_KEY
    sb = client.create_sandbox("desktop")        # answers once it is running
    print(client.exec(sb, "uname -a").stdout)
    png = client.screenshot(sb)
    client.delete_sandbox(sb)
"""

from .client import BerthError, Client
from .types import (
    ComputerResult,
    Endpoints,
    Event,
    EventPage,
    Lease,
    OutputChunk,
    Run,
    RunOutput,
    RunStatus,
    Sandbox,
    SandboxStatus,
    Viewer,
)

__version__ = "0.1.0"

__all__ = [
    "BerthError",
    "Client",
    "ComputerResult",
    "Endpoints",
    "Event",
    "EventPage",
    "Lease",
    "OutputChunk",
    "Run",
    "RunOutput",
    "RunStatus",
    "Sandbox",
    "SandboxStatus",
    "Viewer",
]
