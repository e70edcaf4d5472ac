"""The adapter to the Docker engine: every docker call of trainbase's build and conformance
packages goes through here (or, for BuildKit builds only, through its sibling
`trainbase_common.buildkit`), typed, and nothing else reads docker output.

The docker SDK (pinned `docker`) for everything it does well: engine facts, images (inspect,
tag, remove, pull, push, import, save), registry lookups with the credentials `docker login`
stored, containers, exec, networks. DOCKER_HOST (and DOCKER_CONFIG) are honoured.

Callers use this package's names (``from trainbase_common import engine``; ``engine.pull(ref)``);
each is written in the module of its concern:

* `sdk` -- the SDK client, the errors every call raises, the engine's own facts;
* `images` -- local images: inspect, history, tag, list, remove;
* `registry` -- pull, push, a tag's digest in its registry;
* `build` -- a classic (non-BuildKit) build, a root filesystem imported;
* `containers` -- run options, start, exec, copy in, remove; networks;
* `export` -- an image's layers (`docker save`) or flattened filesystem read out.

A test replaces a name where it is looked up: ``engine.pull`` for a caller outside this
package, which calls ``engine.pull(...)``; ``engine.export.inspect_image`` for what
``check_export_space`` asks, since it calls its own import of the name.
"""

from .build import build_legacy, import_rootfs
from .containers import (
    ExecResult,
    RunOptions,
    copy_into,
    create_network,
    exec_in,
    labelled_containers,
    remove_container,
    remove_network,
    run_detached,
)
from .export import check_export_space, export_filesystem, save
from .images import (
    ImageInfo,
    image_exists,
    image_history,
    inspect_image,
    list_tags,
    remove_image,
    repository,
    tag,
)
from .registry import distribution_digest, pull, push, registry_status
from .sdk import EngineAPIError, EngineError, EngineInfo, available, client, info, server_version

__all__ = [
    "labelled_containers",
    "EngineAPIError",
    "EngineError",
    "EngineInfo",
    "ExecResult",
    "ImageInfo",
    "RunOptions",
    "available",
    "build_legacy",
    "check_export_space",
    "client",
    "copy_into",
    "create_network",
    "distribution_digest",
    "exec_in",
    "export_filesystem",
    "image_exists",
    "image_history",
    "import_rootfs",
    "info",
    "inspect_image",
    "list_tags",
    "pull",
    "push",
    "registry_status",
    "remove_container",
    "remove_image",
    "remove_network",
    "repository",
    "run_detached",
    "save",
    "server_version",
    "tag",
]
