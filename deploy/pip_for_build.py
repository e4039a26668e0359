"""This host's pip configuration, as the image build's pip can use it (deploy/image.sh).

`pip config list` shows what the host's pip uses, from its files and its `PIP_*` variables.
Of that, what means the same inside a build container travels: where packages come from
(`index-url`, `extra-index-url`, `find-links`, over http or https only: a `file://` or a
local path names this host's disk), `trusted-host`, `proxy`, `timeout`, `retries`, and the
certificate authorities (`cert`): the bundle is copied beside the file and the file points
where the Dockerfile mounts it. Nothing else does (constraints files and local wheel folders
are paths on this host). Writes DIR/pip.conf and DIR/ca.crt (empty when pip names no bundle);
the Dockerfile mounts them as the build secrets `pip.conf` and `pip-ca.crt`.

Usage: python3 deploy/pip_for_build.py DIR
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

# Where deploy/Dockerfile mounts the secret `pip-ca.crt`.
CA_IN_BUILD = "/run/secrets/pip-ca.crt"
URL_KEYS = ("index-url", "extra-index-url", "find-links")
PLAIN_KEYS = ("trusted-host", "proxy", "timeout", "retries")
# pip's own precedence: its variables over its files, a command's section over [global].
SECTIONS = (":env:", "install", "global")
LINE = re.compile(r"^(?P<section>[^.]+)\.(?P<key>[\w-]+)='(?P<value>.*)'$")


def settings(listing: str) -> dict[str, str]:
    """`pip config list` output → {key: value}, each key from its highest-precedence place."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        match = LINE.match(line.strip())
        if match:
            # `default-timeout` is how PIP_DEFAULT_TIMEOUT is listed; the file key is `timeout`.
            key = "timeout" if match["key"] == "default-timeout" else match["key"]
            found[match["section"], key] = match["value"]
    chosen = {}
    for key in {key for _, key in found}:
        for section in SECTIONS:
            if (section, key) in found:
                chosen[key] = found[section, key]
                break
    return chosen


def remote(values: str) -> str:
    """Keep the http(s) locations of a space- or newline-separated list."""
    return " ".join(v for v in values.split() if v.startswith(("http://", "https://")))


def build_config(host: dict[str, str]) -> tuple[str, Path | None]:
    """(pip.conf text for the build, the host's CA bundle or None)."""
    lines = ["[global]"]
    for key in URL_KEYS:
        kept = remote(host.get(key, ""))
        if kept:
            lines.append(f"{key} = {kept}")
    lines += [f"{key} = {host[key]}" for key in PLAIN_KEYS if host.get(key)]
    bundle = Path(host["cert"]) if host.get("cert") else None
    if bundle is not None and bundle.is_file():
        lines.append(f"cert = {CA_IN_BUILD}")
    else:
        bundle = None
    return "\n".join(lines) + "\n", bundle


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    text, bundle = build_config(settings(listing))
    (out / "pip.conf").write_text(text)
    if bundle is not None:
        shutil.copyfile(bundle, out / "ca.crt")
    else:
        (out / "ca.crt").write_text("")
    print(f"pip configuration for the build ({out / 'pip.conf'}):\n{text}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
