"""trainbase.budget: a built cell against its size budget and its waste budget, and the text
that says where the bytes are."""

import pytest

from trainbase.supply.budget import LARGEST_DIRS_COMMAND, check_budget, fmt_size, largest_dirs
from trainbase_common.layers import LayerFile, LayerScan, layer_waste

GB = 10**9

DU = "\n".join(
    f"{size}\t{path}"
    for size, path in [
        (9_840_000_000, "/"),
        (7_000_000_000, "/usr"),
        (5_200_000_000, "/usr/local"),
        (5_100_000_000, "/usr/local/lib"),
        (5_000_000_000, "/usr/local/lib/python3.12"),
        (4_900_000_000, "/usr/local/lib/python3.12/dist-packages"),
        (2_500_000_000, "/usr/local/lib/python3.12/dist-packages/torch"),
        (2_400_000_000, "/usr/local/lib/python3.12/dist-packages/torch/lib"),
        (2_000_000_000, "/usr/local/lib/python3.12/dist-packages/nvidia"),
        (900_000_000, "/usr/local/lib/python3.12/dist-packages/nvidia/cublas"),
        (700_000_000, "/usr/local/lib/python3.12/dist-packages/nvidia/cudnn"),
        (1_500_000_000, "/usr/lib"),
        (1_400_000_000, "/usr/lib/x86_64-linux-gnu"),
        (2_600_000_000, "/opt"),
        (2_600_000_000, "/opt/hpcx"),
        (1_000_000_000, "/opt/hpcx/ompi"),
        (600_000_000, "/opt/hpcx/ucx"),
        (200_000_000, "/var"),
        (150_000_000, "/var/lib"),
    ]
)


def _contains(a: str, b: str) -> bool:
    return a == "/" or b.startswith(a.rstrip("/") + "/")


def test_largest_dirs_are_the_deepest_and_never_nested():
    # at 1.5 GB: /opt/hpcx's parts are smaller, torch's bytes are in torch/lib, nvidia's spread
    # over its packages, /usr/lib's x86_64-linux-gnu is 1.4 GB; /usr/local is none of these
    top = largest_dirs(DU, n=4)
    assert top == [
        ("/opt/hpcx", 2_600_000_000),
        ("/usr/local/lib/python3.12/dist-packages/torch/lib", 2_400_000_000),
        ("/usr/local/lib/python3.12/dist-packages/nvidia", 2_000_000_000),
        ("/usr/lib", 1_500_000_000),
    ]


def test_largest_dirs_with_a_high_threshold_stop_at_the_directory_that_holds_the_bytes():
    # at 2.6 GB: dist-packages (neither torch nor nvidia alone has 2.6 GB) and /opt/hpcx
    assert largest_dirs(DU, n=2) == [
        ("/usr/local/lib/python3.12/dist-packages", 4_900_000_000),
        ("/opt/hpcx", 2_600_000_000),
    ]


@pytest.mark.parametrize("n", [1, 3, 5, 10, 50])
def test_largest_dirs_never_count_a_byte_twice(n):
    top = largest_dirs(DU, n=n)
    paths = [p for p, _ in top]
    assert len(top) == min(n, 7)  # DU has 7 directories without a subdirectory listed
    assert not [(a, b) for a in paths for b in paths if a != b and _contains(a, b)]
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)


def test_largest_dirs_ignores_noise_and_takes_space_separated_output():
    assert largest_dirs("du: cannot read directory '/x': Permission denied\n300 /a\n200 /a/b\n", n=1) == [("/a", 300)]
    assert largest_dirs("", n=10) == []


def test_largest_dirs_command_sorts_sizes_of_one_filesystem_in_bytes():
    assert LARGEST_DIRS_COMMAND.startswith("du -x -b --max-depth=")
    assert "sort -rn" in LARGEST_DIRS_COMMAND and "sed -n 1,400p" in LARGEST_DIRS_COMMAND
    from trainbase.render.pipefail_lint import check_shell  # the cut reads to the end: no SIGPIPE

    assert not check_shell(LARGEST_DIRS_COMMAND, "LARGEST_DIRS_COMMAND")


def test_fmt_size_is_decimal_gb_with_two_decimals():
    assert fmt_size(9_840_000_000) == "9.84 GB"
    assert fmt_size(10_000_000) == "0.01 GB"
    assert fmt_size(4_200_000) == "4.2 MB"


LAYERS = [
    {"created_by": "/bin/sh -c #(nop) ADD file:abc in / ", "size": 80_000_000},
    {"created_by": "ENV A=b", "size": 0},
    {"created_by": "RUN |1 PY=3.12 /bin/sh -c pip install torch # buildkit", "size": 5_000_000_000},
    {"created_by": "RUN /bin/sh -c apt-get install -y cuda-libraries # buildkit", "size": 3_000_000_000},
    {"created_by": "COPY hpcx /opt/hpcx # buildkit", "size": 1_500_000_000},
    {"created_by": "RUN /bin/sh -c apt-get install -y openssh # buildkit", "size": 200_000_000},
    {"created_by": "COPY tb /opt/trainbase # buildkit", "size": 60_000_000},
]


def _waste(wasted: int) -> LayerScan:
    files = [
        LayerFile(0, "var/lib/apt/lists/big_Packages", "file", wasted),
        LayerFile(0, "etc/x", "file", 5),
        LayerFile(1, "var/lib/apt/lists/.wh..wh..opq", "file", 0),
    ]
    return layer_waste(
        LayerScan("x", ["a", "b"], ["RUN /bin/sh -c apt-get update", "RUN /bin/sh -c rm -rf lists"], files)
    )


def test_an_over_budget_cell_says_where_its_bytes_are():
    v = check_budget("pytorch-x", 9_840_000_000, 9.0, LAYERS, largest_dirs(DU), None)
    assert v.over_size and not v.over_waste and not v.ok
    lines = v.message().splitlines()
    assert lines[0] == "cell pytorch-x is 9.84 GB, over its budget of 9.0 GB (matrix.yaml size_budget_gb)"
    assert lines[1] == "  largest layers:"
    assert lines[2:7] == [
        "      5.00 GB  RUN pip install torch",
        "      3.00 GB  RUN apt-get install -y cuda-libraries",
        "      1.50 GB  COPY hpcx /opt/hpcx",
        "      0.20 GB  RUN apt-get install -y openssh",
        "      0.08 GB  ADD file:abc in /",
    ]
    assert lines[7] == "  largest directories:"
    assert len(lines[8:]) == 7  # the ten largest of DU's seven directories that contain no other
    assert lines[8] == "      2.40 GB  /usr/local/lib/python3.12/dist-packages/torch/lib"
    with_waste = check_budget("pytorch-x", 9_840_000_000, 9.0, LAYERS, largest_dirs(DU), _waste(100_000_000))
    assert with_waste.message().splitlines()[-1] == "  its layers waste 0.10 GB (1.0%), within the 3% allowed"


def test_a_cell_within_its_budget_is_one_line():
    v = check_budget("c", 8_990_000_000, 9, LAYERS, [], _waste(3_000_000))
    assert v.ok and v.message() == "cell c is 8.99 GB, within its budget of 9.0 GB; its layers waste 3.0 MB (0.0%)"
    assert check_budget("c", 9 * GB, 9, LAYERS, [], None).message() == "cell c is 9.00 GB, within its budget of 9.0 GB"


def test_waste_over_three_percent_lists_the_wasted_files():
    size = 5 * GB
    under = check_budget("c", size, 9, LAYERS, [], _waste(int(0.03 * size)))
    assert not under.over_waste  # 3% exactly is within
    v = check_budget("c", size, 9, LAYERS, [], _waste(int(0.031 * size) + 1))
    assert v.over_waste and not v.over_size
    lines = v.message().splitlines()
    assert lines[0].startswith("cell c wastes 0.16 GB (3.1%) of its 5.00 GB, over the 3% allowed")
    assert lines[1] == "  largest wasted files:"
    assert lines[2] == (
        "      0.16 GB  /var/lib/apt/lists/big_Packages written in layer 1/2: RUN apt-get update; "
        "hidden in layer 2/2: RUN rm -rf lists"
    )
    assert len(lines) == 3  # /etc/x is not below the opaque directory


def test_a_stricter_waste_budget_is_honoured():
    assert check_budget("c", 5 * GB, 9, LAYERS, [], _waste(60_000_000), waste_budget_share=0.01).over_waste


def test_image_history_is_bottom_first_in_the_shape_check_budget_takes(monkeypatch):
    from trainbase_common import engine

    class Image:
        def history(self):  # the engine's answer: newest step first
            return [
                {"CreatedBy": "COPY tb /opt/trainbase # buildkit", "Size": 60, "Id": "sha256:b"},
                {"CreatedBy": "ENV A=b", "Size": 0, "Id": "<missing>"},
                {"CreatedBy": "/bin/sh -c #(nop) ADD file:abc in / ", "Size": 80, "Id": "<missing>"},
            ]

    class Images:
        def get(self, ref):
            assert ref == "trainbase/x:latest"
            return Image()

    class Client:
        images = Images()

    monkeypatch.setattr(engine.images, "client", lambda: Client())  # where image_history looks it up
    layers = engine.image_history("trainbase/x:latest")
    assert layers == [
        {"created_by": "/bin/sh -c #(nop) ADD file:abc in / ", "size": 80},
        {"created_by": "ENV A=b", "size": 0},
        {"created_by": "COPY tb /opt/trainbase # buildkit", "size": 60},
    ]
    assert check_budget("x", 2 * GB, 1, layers, [], None).largest_layers == [
        (80, "ADD file:abc in /"),
        (60, "COPY tb /opt/trainbase"),
    ]
