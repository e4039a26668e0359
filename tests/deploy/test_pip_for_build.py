"""deploy/pip_for_build.py: which of the host's pip settings reach the image build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.deploy.manifests import DEPLOY, load_script


def _module() -> Any:
    return load_script("pip_for_build.py")


LISTING = """\
:env:.cert='{ca}'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/elsewhere/ca.pem'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple https://mirror.test/simple'
global.index-url='https://index.test/simple'
install.index-url='https://install.test/simple'
"""


def test_remote_sources_and_the_ca_travel_local_paths_do_not(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    pip = _module()
    host = pip.settings(LISTING.format(ca=ca))
    assert host["cert"] == str(ca)  # the variable over the file
    assert host["index-url"] == "https://install.test/simple"  # [install] over [global]
    text, bundle = pip.build_config(host)
    assert bundle == ca
    assert text.splitlines() == [
        "[global]",
        "index-url = https://install.test/simple",
        "extra-index-url = https://mirror.test/simple",
        "timeout = 180",
        f"cert = {pip.CA_IN_BUILD}",
    ]


def test_the_ca_path_is_where_the_dockerfile_mounts_the_secret() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"id=pip-ca.crt,target={_module().CA_IN_BUILD}" in dockerfile
    assert "id=pip.conf,target=/etc/pip.conf" in dockerfile
    script = (DEPLOY / "image.sh").read_text()
    assert "id=pip.conf,src=" in script and "id=pip-ca.crt,src=" in script


def test_this_hosts_configuration_is_written(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(DEPLOY / "pip_for_build.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    conf = (tmp_path / "pip.conf").read_text()
    assert conf.startswith("[global]\n") and "file://" not in conf
    assert (tmp_path / "ca.crt").exists()
