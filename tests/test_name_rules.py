"""Name rules of the namespace, without a mount."""

import errno

import pytest

from hicachefs import names


@pytest.mark.parametrize("path, ok", [
    (b"m/f/tp0of1/kv/" + b"a" * 64, True),
    (b"m/f/all.pp1of2/mamba/key", True),
    ("m/f/s/p/ключ".encode(), True),
    (b"m/f/s/p/" + b"k" * 200, True),
    (b"m/f/s/p/" + b"k" * 201, False),
    (b"m/f/s/p/.tmp", False),
    (b"m/f/s/p", False),
    (b"m/f/s/p/k/x", False),
    (b"m//s/p/k", False),
    (b"/m/f/s/p/k", False),
    (b"m/f/s/p/k\x00", False),
    (b"m/f/s/p/\xff", False),
    (b"../f/s/p/k", False),
])
def test_check_page_path(path, ok):
    assert (names.check_page_path(path) is not None) == ok


@pytest.mark.parametrize("name, err", [
    (b"", errno.EINVAL), (b".x", errno.EINVAL), (b"a\x00b", errno.EINVAL),
    (b"x" * 201, errno.ENAMETOOLONG), (b"\xff", errno.EINVAL),
])
def test_bad_components(name, err):
    with pytest.raises(names.BadName) as info:
        names.check_component(name)
    assert info.value.errno == err
