"""Templates from registry images, driven by the official SDK's `Template` builder against `warren up`.

Registries are Debian's `docker-registry` on free loopback ports (one open, one behind htpasswd), the
images are written by the test as OCI layouts (`oci_images.py`) and pushed with skopeo:

- an Alpine-like image: static busybox, `/bin/sh`, no bash, only `root` in /etc/passwd;
- a three-layer image on the same busybox layer: files deleted by a whiteout, a directory made opaque;
- a multi-arch index (amd64 and arm64, each with a marker file), one amd64 layer zstd-compressed;
- the busybox image in a private repository.

Run under /tmp/privnet.sh (loopback is private there).
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from oci_images import LayerTar, OciLayout, Registry, busybox_layer, missing_tools

PRIVATE_LOGIN = ("warren-e2e", "pw-Zq81-private")


@pytest.fixture(scope="module")
def registries(tmp_path_factory):
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    public = Registry()
    private = Registry(auth=PRIVATE_LOGIN)
    try:
        layout = OciLayout(tmp_path_factory.mktemp("oci"))
        base = busybox_layer()
        busybox = layout.image([base])
        layout.tag(busybox, "busybox")
        public.push(layout, "busybox", "e2e/busybox:1")
        private.push(layout, "busybox", "secret/busybox:1")

        files = (
            LayerTar()
            .dir("opt")
            .dir("opt/app")
            .file("opt/app/keep", b"kept\n")
            .file("opt/app/gone", b"deleted later\n")
            .dir("opt/cache")
            .file("opt/cache/old-1", b"1\n")
            .file("opt/cache/old-2", b"2\n")
            .bytes()
        )
        deletions = (
            LayerTar()
            .dir("opt")
            .dir("opt/app")
            .whiteout("opt/app/gone")
            .dir("opt/cache")
            .opaque("opt/cache")
            .file("opt/cache/fresh", b"fresh\n")
            .bytes()
        )
        layered = layout.image([base, files, deletions])
        layout.tag(layered, "layered")
        public.push(layout, "layered", "e2e/layered:1")

        def arch_layer(arch):
            return LayerTar().dir("etc").file("etc/warren-arch", f"{arch}\n".encode()).bytes()

        app = layout.image(
            [base, LayerTar().dir("srv").bytes()],
            env=["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello-from-image"],
            workdir="/srv",
        )
        layout.tag(app, "app")
        public.push(layout, "app", "e2e/app:1")

        amd64 = layout.image([base, arch_layer("amd64")], compression=["gzip", "zstd"])
        arm64 = layout.image([base, arch_layer("arm64")], arch="arm64")
        layout.tag(layout.index([arm64, amd64]), "multi")
        public.push(layout, "multi", "e2e/multi:1", all_platforms=True)
        yield public, private
    finally:
        public.stop()
        private.stop()


def build(template, alias):
    from e2b import Template

    logs = []
    info = Template.build(template, alias=alias, on_build_logs=lambda e: logs.append(e.message))
    return info, logs


def image_layer_dirs(state_dir) -> list[Path]:
    return sorted(p for p in (Path(state_dir) / "layers").glob("img-*") if (p / "layer.json").is_file())


def test_busybox_image_runs_sdk_commands_as_user(warren, sdk_env, registries):
    from e2b import Sandbox, Template

    public, _ = registries
    template = Template().from_image(f"{public.host}/e2e/busybox:1").run_cmd("echo built-by-$(id -un) > ~/built.txt")
    info, logs = build(template, "wt-e2e-img-busybox")
    assert any("created user user" in line for line in logs), logs
    assert any("/bin/bash runs /bin/sh" in line for line in logs), logs
    sandbox = Sandbox.create(template="wt-e2e-img-busybox", timeout=120)
    try:
        who = sandbox.commands.run("id -un; pwd; cat /etc/os-release; cat ~/built.txt")
        assert who.stdout.split("\n")[:4] == ["user", "/home/user", "ID=warren-busybox", "built-by-user"], who
        root = sandbox.commands.run("id -u", user="root")
        assert root.stdout.strip() == "0"
        sandbox.files.write("/home/user/note.txt", "from files api")
        assert sandbox.commands.run("cat /home/user/note.txt").stdout == "from files api"
    finally:
        sandbox.kill()
    # A template built on it (fromTemplate) stacks on its image layers.
    build(Template().from_template("wt-e2e-img-busybox").run_cmd("echo child > ~/child.txt"), "wt-e2e-img-child")
    child = Sandbox.create(template="wt-e2e-img-child", timeout=120)
    try:
        assert child.commands.run("cat ~/built.txt ~/child.txt").stdout == "built-by-user\nchild\n"
    finally:
        child.kill()


def test_whiteouts_and_opaque_dirs_are_honoured_and_layers_shared(warren, sdk_env, registries):
    from e2b import Sandbox, Template

    public, _ = registries
    before = {p.name for p in image_layer_dirs(warren.state_dir)}
    template = Template().from_image(f"{public.host}/e2e/layered:1")
    _, logs = build(template, "wt-e2e-img-layered")
    layer_lines = [line for line in logs if line.startswith("layer sha256:")]
    assert len(layer_lines) == 3, logs
    after = {p.name for p in image_layer_dirs(warren.state_dir)}
    if before:
        # The busybox layer the first test pulled is reused, not fetched again: one new dir per new layer.
        assert "cached" in layer_lines[0], layer_lines
        assert len(after - before) == 2, (before, after)
    sandbox = Sandbox.create(template="wt-e2e-img-layered", timeout=120)
    try:
        assert sandbox.commands.run("ls /opt/app").stdout.split() == ["keep"]
        assert sandbox.commands.run("ls /opt/cache").stdout.split() == ["fresh"]
        assert sandbox.commands.run("cat /opt/app/keep").stdout == "kept\n"
    finally:
        sandbox.kill()


def test_a_layer_shared_by_two_templates_is_stored_once(warren, sdk_env, registries):
    public, _ = registries
    from e2b import Template

    build(Template().from_image(f"{public.host}/e2e/busybox:1"), "wt-e2e-img-share-a")
    _, logs = build(Template().from_image(f"{public.host}/e2e/layered:1").run_cmd("true"), "wt-e2e-img-share-b")
    # busybox's one layer is the layered image's bottom layer: three layer dirs in all, not four.
    assert len(image_layer_dirs(warren.state_dir)) == 3, (image_layer_dirs(warren.state_dir), logs)
    layer_lines = [line for line in logs if line.startswith("layer sha256:")]
    assert len(layer_lines) == 3 and all("cached" in line for line in layer_lines), logs


def test_multi_arch_index_picks_linux_amd64(warren, sdk_env, registries):
    from e2b import Sandbox, Template

    public, _ = registries
    _, logs = build(Template().from_image(f"{public.host}/e2e/multi:1"), "wt-e2e-img-multi")
    sandbox = Sandbox.create(template="wt-e2e-img-multi", timeout=120)
    try:
        assert sandbox.commands.run("cat /etc/warren-arch").stdout == "amd64\n"
    finally:
        sandbox.kill()


def test_private_repository_needs_the_login_and_never_leaks_it(warren, sdk_env, registries):
    from e2b import Sandbox, Template
    from e2b.exceptions import BuildException

    _, private = registries
    image = f"{private.host}/secret/busybox:1"
    with pytest.raises(BuildException) as refused:
        build(Template().from_image(image), "wt-e2e-img-private-refused")
    assert "unauthorized" in str(refused.value), refused.value
    with pytest.raises(BuildException):
        build(Template().from_image(image, username=PRIVATE_LOGIN[0], password="wrong-password"), "wt-e2e-img-private-wrong")

    info, logs = build(
        Template().from_image(image, username=PRIVATE_LOGIN[0], password=PRIVATE_LOGIN[1]),
        "wt-e2e-img-private",
    )
    assert not any(PRIVATE_LOGIN[1] in line for line in logs)
    sandbox = Sandbox.create(template="wt-e2e-img-private", timeout=120)
    try:
        assert sandbox.commands.run("id -un").stdout.strip() == "user"
    finally:
        sandbox.kill()
    # Nothing the server wrote holds the password: not the store, not a build record, not a log.
    secret = PRIVATE_LOGIN[1].encode()
    # Files on other mounts inside the state dir (LXCFS's view of the cgroups) are not Warren's writing.
    state_dev = os.stat(warren.state_dir).st_dev
    for path in Path(warren.state_dir).rglob("*"):
        if (path.is_file() and not path.is_symlink() and "/layers/" not in str(path)
                and path.stat().st_dev == state_dev):
            assert secret not in path.read_bytes(), path
    assert PRIVATE_LOGIN[1] not in warren.log()


def test_deleting_a_template_prunes_only_the_layers_nothing_else_uses(warren, sdk_env, registries):
    from e2b import Template

    public, _ = registries
    build(Template().from_image(f"{public.host}/e2e/multi:1"), "wt-e2e-img-prune")
    before = {p.name for p in image_layer_dirs(warren.state_dir)}
    # Both templates of the multi-arch image go; the busybox layer they share with the others stays.
    for name in ("wt-e2e-img-prune", "wt-e2e-img-multi"):
        result = warren.cli("template", "delete", name)
        assert result.returncode == 0, result.stdout + result.stderr
    after = {p.name for p in image_layer_dirs(warren.state_dir)}
    assert len(before - after) == 1, (before, after)
    assert after < before


def test_dockerfile_from_a_registry_image_keeps_its_env_and_workdir(warren, sdk_env, registries, tmp_path):
    from e2b import Sandbox

    public, _ = registries
    (tmp_path / "e2b.Dockerfile").write_text(
        f"FROM {public.host}/e2e/app:1\n"
        'RUN pwd > /tmp/build-pwd && echo "$GREETING" > /greeting\n'
        "WORKDIR /work\n"
    )
    result = warren.cli("template", "build", str(tmp_path), "--name", "wt-e2e-img-dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    sandbox = Sandbox.create(template="wt-e2e-img-dockerfile", timeout=120)
    try:
        # Docker semantics while building (the image's WORKDIR and ENV), E2B's user in the sandbox.
        out = sandbox.commands.run("cat /tmp/build-pwd /greeting; test -d /work && echo made; id -un").stdout
        assert out.split() == ["/srv", "hello-from-image", "made", "user"], out
    finally:
        sandbox.kill()


def test_bench_cached_image_build_and_ten_templates_sharing_a_base(warren, sdk_env, registries):
    """Benchmark (printed, not asserted on time): a fully cached rebuild from a pulled image, and the
    disk ten templates on one base use. The layer sharing itself is asserted."""
    from e2b import Template

    public, _ = registries
    image = f"{public.host}/e2e/layered:1"
    build(Template().from_image(image), "wt-e2e-img-bench-0")
    started = time.monotonic()
    _, logs = build(Template().from_image(image), "wt-e2e-img-bench-0")
    cached_s = time.monotonic() - started
    assert any("1 of 1 steps cached" in line for line in logs), logs
    layers_dir = Path(warren.state_dir) / "layers"
    before = {p.name for p in image_layer_dirs(warren.state_dir)}
    for i in range(1, 10):
        build(Template().from_image(image).run_cmd(f"echo {i} > ~/n"), f"wt-e2e-img-bench-{i}")
    assert {p.name for p in image_layer_dirs(warren.state_dir)} == before  # no image layer twice

    def du(paths):
        out = subprocess.run(["du", "-sck", *map(str, paths)], capture_output=True, text=True).stdout
        return int(out.strip().splitlines()[-1].split()[0])

    image_kib = du(p for p in layers_dir.glob("img-*"))
    all_kib = du([layers_dir])
    print(
        f"\nBENCH template from a cached image: fully cached rebuild {cached_s:.2f}s; "
        f"ten templates on one base: layers {all_kib} KiB in all, of which image layers {image_kib} KiB"
    )


def test_tags_name_builds_and_sandboxes_start_the_tagged_one(warren, sdk_env, registries):
    from e2b import Sandbox, Template
    from e2b.exceptions import NotFoundException, TemplateException

    public, _ = registries
    name = "wt-e2e-img-tags"
    image = f"{public.host}/e2e/busybox:1"
    first = Template.build(Template().from_image(image).run_cmd("echo one > ~/v"), name, tags=["v1"])
    second = Template.build(Template().from_image(image).run_cmd("echo two > ~/v"), name, tags=["v2"])
    assert first.build_id != second.build_id

    def version(reference):
        sandbox = Sandbox.create(template=reference, timeout=120)
        try:
            return sandbox.commands.run("cat ~/v").stdout.strip()
        finally:
            sandbox.kill()

    # The older build keeps answering to its tag after the rebuild; the bare name is the current build.
    assert version(f"{name}:v1") == "one"
    assert version(f"{name}:v2") == "two"
    assert version(name) == "two"

    assigned = Template.assign_tags(f"{name}:v1", ["stable"])
    assert assigned.build_id == first.build_id
    tags = {t.tag: str(t.build_id) for t in Template.get_tags(name)}
    assert tags == {"v1": first.build_id, "v2": second.build_id, "stable": first.build_id}, tags
    assert version(f"{name}:stable") == "one"
    Template.remove_tags(name, ["stable"])
    assert "stable" not in {t.tag for t in Template.get_tags(name)}
    with pytest.raises((NotFoundException, TemplateException)):
        Template.remove_tags(name, ["stable"])
    with pytest.raises(Exception) as unknown:
        Sandbox.create(template=f"{name}:stable", timeout=60)
    assert "not found" in str(unknown.value).lower(), unknown.value


def test_a_rebuild_on_a_changed_image_leaves_an_old_paused_sandbox_resumable(warren, sdk_env, registries, tmp_path):
    from e2b import Sandbox, Template

    public, _ = registries
    layout = OciLayout(tmp_path / "oci")
    base = busybox_layer()

    def push(marker):
        layer = LayerTar().dir("etc").file("etc/warren-version", f"{marker}\n".encode()).bytes()
        layout.tag(layout.image([base, layer]), "moving")
        public.push(layout, "moving", "e2e/moving:1")

    name = "wt-e2e-img-moving"
    push("v1")
    Template.build(Template().from_image(f"{public.host}/e2e/moving:1"), name)
    old = Sandbox.create(template=name, timeout=300)
    try:
        old.files.write("/home/user/mine.txt", "written before the pause")
        old.pause()
        assert Sandbox.get_info(old.sandbox_id).state.value == "paused"

        # The tag now names another image: the rebuild pulls its new layer, the old one stays.
        push("v2")
        Template.build(Template().from_image(f"{public.host}/e2e/moving:1"), name)
        new = Sandbox.create(template=name, timeout=120)
        try:
            assert new.commands.run("cat /etc/warren-version").stdout == "v2\n"
        finally:
            new.kill()
        # Deleting another template prunes: the paused sandbox's layers must survive it.
        Template.build(Template().from_image(f"{public.host}/e2e/busybox:1").run_cmd("true"), "wt-e2e-img-other")
        deleted = warren.cli("template", "delete", "wt-e2e-img-other")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr

        try:
            resumed = Sandbox.connect(old.sandbox_id, timeout=300)
        except Exception:
            print(warren.log()[-4000:])
            raise
        assert resumed.commands.run("cat /etc/warren-version /home/user/mine.txt").stdout == (
            "v1\nwritten before the pause"
        )
    finally:
        Sandbox.kill(old.sandbox_id)
