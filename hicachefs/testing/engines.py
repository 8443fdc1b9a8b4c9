"""Every engine the shared tier is tested and benchmarked on, by the name tests use for it."""

from hicachefs.testing.glusterfs import GlusterVolume
from hicachefs.testing.juicefs import JuiceVolume

ENGINES = {"glusterfs": GlusterVolume, "juicefs": JuiceVolume}
