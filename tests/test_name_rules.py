"""Name rules of the namespace, without a mount."""

import errno

import pytest

from hicachefs import names


@pytest.mark.parametrize("name, err", [
    (b"", errno.EINVAL), (b".x", errno.EINVAL), (b"a\x00b", errno.EINVAL),
    (b"x" * 201, errno.ENAMETOOLONG), (b"\xff", errno.EINVAL),
])
def test_bad_components(name, err):
    with pytest.raises(names.BadName) as info:
        names.check_component(name)
    assert info.value.errno == err
