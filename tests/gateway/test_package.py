"""The gateway package's public names load lazily: the CLI and `import harnessrl.gateway` stay light."""

from __future__ import annotations

import subprocess
import sys


def test_exports_load_lazily_and_resolve():
    code = (
        "import sys, harnessrl.gateway as g, harnessrl.gateway.cli\n"
        "assert 'aiohttp' not in sys.modules and 'pyarrow' not in sys.modules\n"
        "g.GatewayConfig, g.GatewayAdmin, g.SessionInfo\n"
        "assert 'aiohttp' not in sys.modules\n"
        "from harnessrl.gateway.server import GatewayServer, GatewayConfig as C\n"
        "assert g.GatewayServer is GatewayServer and g.GatewayConfig is C\n"
        "assert sorted(g.__all__) == ['GatewayAdmin', 'GatewayConfig', 'GatewayServer', 'SessionInfo']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
