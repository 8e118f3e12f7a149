"""Test images and registries for template-from-image tests, without Docker.

- `OciLayout` writes an OCI image layout (blobs, manifests, indexes) from layers this module builds as
  tar files (gzip, zstd or plain), so a test controls every byte: whiteouts, opaque dirs, platforms.
- `skopeo copy` pushes a layout to a registry.
- `Registry` runs Debian's `docker-registry` on a free loopback port with its own config and storage
  (optionally behind htpasswd basic auth); the system service is never used.

Everything listens on and talks to 127.0.0.1 only.
"""

import crypt
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "none": "application/vnd.oci.image.layer.v1.tar",
}


def missing_tools() -> str | None:
    for tool in ("docker-registry", "skopeo", "zstd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.d/10-apt.sh)"
    if not BUSYBOX.is_file():
        return "no /bin/busybox (apt-get install busybox-static)"
    ldd = subprocess.run(["ldd", str(BUSYBOX)], capture_output=True, text=True)
    if "not a dynamic executable" not in ldd.stdout + ldd.stderr:
        return "/bin/busybox is not the static one (apt-get install busybox-static)"
    return None


class LayerTar:
    """A layer built entry by entry (deterministic: fixed mtimes, sorted by the caller's order)."""

    def __init__(self):
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)

    def _info(self, name, kind, mode, uid=0, gid=0):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.uid, info.gid = uid, gid
        info.mtime = 1_700_000_000
        return info

    def dir(self, name, mode=0o755, uid=0, gid=0):
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, uid, gid))
        return self

    def file(self, name, data: bytes, mode=0o644, uid=0, gid=0):
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        return self

    def symlink(self, name, target):
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)
        return self

    def whiteout(self, path):
        parent, _, base = path.rpartition("/")
        return self.file(f"{parent}/.wh.{base}" if parent else f".wh.{base}", b"")

    def opaque(self, directory):
        return self.file(f"{directory}/.wh..wh..opq", b"")

    def bytes(self) -> bytes:
        self.tar.close()
        return self.buffer.getvalue()


def busybox_layer() -> bytes:
    """An Alpine-like root: static busybox as every applet, /bin/sh, no bash, only root in passwd."""
    layer = LayerTar()
    for d in ("bin", "dev", "etc", "proc", "root", "run", "sys", "usr", "usr/bin", "var"):
        layer.dir(d)
    layer.dir("tmp", mode=0o1777)
    layer.file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in sorted(set(applets)):
        if applet not in ("busybox", "bash"):
            layer.symlink(f"bin/{applet}", "busybox")
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    layer.file("etc/group", b"root:x:0:\n")
    layer.file("etc/os-release", b"ID=warren-busybox\n")
    return layer.bytes()


def compress(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if how == "zstd":
        return subprocess.run(["zstd", "-q", "-c", "-3"], input=data, capture_output=True, check=True).stdout
    return data


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class OciLayout:
    """An OCI image layout directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.refs = []

    def blob(self, data: bytes, media_type: str) -> dict:
        digest = sha256(data)
        (self.path / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, layers, compression="gzip", env=None, cmd=None, arch="amd64", workdir=None) -> dict:
        """An image manifest of `layers` (uncompressed tars, bottom first); returns its descriptor."""
        descriptors, diff_ids = [], []
        for layer in layers:
            how = compression if isinstance(compression, str) else compression.pop(0)
            descriptors.append(self.blob(compress(layer, how), LAYER_TYPES[how]))
            diff_ids.append(sha256(layer))
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {
                "Env": env or ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "Cmd": cmd or ["sh"],
                **({"WorkingDir": workdir} if workdir else {}),
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": self.blob(json.dumps(config).encode(), OCI_CONFIG),
            "layers": descriptors,
        }
        desc = self.blob(json.dumps(manifest).encode(), OCI_MANIFEST)
        desc["platform"] = {"architecture": arch, "os": "linux"}
        return desc

    def index(self, manifests) -> dict:
        body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.blob(json.dumps(body).encode(), OCI_INDEX)

    def tag(self, descriptor: dict, name: str):
        entry = {k: v for k, v in descriptor.items() if k != "platform"}
        entry["annotations"] = {"org.opencontainers.image.ref.name": name}
        self.refs = [r for r in self.refs if r["annotations"]["org.opencontainers.image.ref.name"] != name]
        self.refs.append(entry)
        (self.path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": self.refs}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`docker-registry serve` on 127.0.0.1:<free port>, optionally behind htpasswd."""

    def __init__(self, auth: tuple[str, str] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="wt-registry-"))
        self.port = free_port()
        self.auth = auth
        config = [
            "version: 0.1",
            "log:",
            "  level: warn",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.dir / 'data'}",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
        ]
        if auth:
            user, password = auth
            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
            (self.dir / "htpasswd").write_text(f"{user}:{hashed}\n")
            config += ["auth:", "  htpasswd:", "    realm: warren-test", f"    path: {self.dir / 'htpasswd'}"]
        (self.dir / "config.yml").write_text("\n".join(config) + "\n")
        self.log = open(self.dir / "registry.log", "w")
        self.process = subprocess.Popen(
            ["docker-registry", "serve", str(self.dir / "config.yml")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.dir / 'registry.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("docker-registry did not listen")
                time.sleep(0.1)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, layout: OciLayout, tag: str, repository: str, all_platforms=False):
        """Pushes layout tag `tag` as `<host>/<repository>`."""
        args = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if all_platforms:
            args.append("--all")
        if self.auth:
            args.append(f"--dest-creds={self.auth[0]}:{self.auth[1]}")
        args += [f"oci:{layout.path}:{tag}", f"docker://{self.host}/{repository}"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"skopeo copy failed: {result.stderr}")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
