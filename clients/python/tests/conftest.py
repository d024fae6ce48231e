"""Fixtures for the tests against a live controller (``BERTH_URL``, ``BERTH_API_KEY``).

``tests/tests/osworld.rs`` starts ``berth serve`` on the Docker provider and runs these; without
``BERTH_URL`` they are skipped.

OSWorld's code comes from PyPI (``pip install --no-deps desktop-env==1.0.2``) with only what its
controllers, setup controller, getters and the metrics used here import (``tests/setup.sh``).
Its metrics package imports every metric module in its ``__init__`` (and with them PDF, office,
audio and vision libraries these tests never call): below, that package is made importable
without running its ``__init__``; the metric modules the tests name are loaded for real, and so
is every module OSWorld's own code imports from it (the setup controller imports ``utils``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import types
import uuid

import pytest

#: The OSWorld metric modules these tests' evaluators use.
METRIC_MODULES = ("vscode", "general", "basic_os")


def _metrics_without_init() -> None:
    name = "desktop_env.evaluators.metrics"
    if name in sys.modules:
        return
    evaluators = importlib.import_module("desktop_env.evaluators")
    location = os.path.join(os.path.dirname(evaluators.__file__), "metrics")
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [location]
    package = types.ModuleType(name)
    package.__spec__ = spec
    package.__path__ = [location]
    package.__package__ = name
    package.__file__ = os.path.join(location, "__init__.py")
    sys.modules[name] = package
    evaluators.metrics = package
    for m in METRIC_MODULES:
        module = importlib.import_module(f"{name}.{m}")
        for attr, value in vars(module).items():
            if callable(value) and not attr.startswith("_"):
                setattr(package, attr, value)


try:
    importlib.import_module("desktop_env.providers.base")
    _metrics_without_init()
    DesktopEnv = importlib.import_module("desktop_env.desktop_env").DesktopEnv
    DESKTOP_ENV_ERROR = None
except Exception as e:  # noqa: BLE001 - reported as the skip reason
    DesktopEnv = None
    DESKTOP_ENV_ERROR = f"OSWorld's desktop_env is not importable: {type(e).__name__}: {e}"


def pytest_report_header(config):
    return [
        f"berth controller: {os.environ.get('BERTH_URL') or '(BERTH_URL unset: the tests skip)'}",
        f"desktop_env: {'importable' if DESKTOP_ENV_ERROR is None else DESKTOP_ENV_ERROR}",
    ]


@pytest.fixture(scope="session")
def berth_url() -> str:
    url = os.environ.get("BERTH_URL")
    if not url:
        pytest.skip("BERTH_URL is not set: these tests need a live controller (tests/tests/osworld.rs starts one)")
    return url


@pytest.fixture
def client(berth_url):
    import berth

    c = berth.Client(berth_url)
    yield c
    c.session.close()


@pytest.fixture(scope="session")
def osworld_code():
    """``berth.osworld`` registered (no controller needed yet)."""
    if DESKTOP_ENV_ERROR is not None:
        pytest.skip(DESKTOP_ENV_ERROR)
    import berth.osworld

    berth.osworld.register(labels={"suite": "python-tests"})
    yield DesktopEnv
    berth.osworld.unregister()


@pytest.fixture(scope="session")
def osworld(berth_url, osworld_code):
    """``DesktopEnv`` with ``provider_name="berth"`` provisioning on the live controller."""
    return osworld_code


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]
