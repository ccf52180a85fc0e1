"""Print pip constraints pinning every OpenTelemetry package, grpcio and prometheus-client to
the floor pyproject.toml allows (its own ">=" bounds), for CI's run at the oldest versions.

An ``opentelemetry-*`` package named only through another's requirements (the API, the
exporter's common encoder) is pinned to the release of the SDK's floor: the OpenTelemetry
Python packages are released together, stable ones as 1.N and the rest as 0.(N+21)b0.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PINNED = re.compile(r"^(opentelemetry-[\w-]+|grpcio|prometheus-client)>=([\w.]+)")


def floors(pyproject: Path) -> dict[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    found: dict[str, str] = {}
    requirements = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += extra
    for requirement in requirements:
        match = PINNED.match(requirement.replace(" ", ""))
        if match:
            found[match[1]] = match[2]
    sdk = found["opentelemetry-sdk"]
    found.setdefault("opentelemetry-api", sdk)
    return found


def main() -> None:
    pyproject = Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")
    for name, version in sorted(floors(pyproject).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
