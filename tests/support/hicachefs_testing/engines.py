"""Every engine the shared tier is tested and benchmarked on, by the name tests use for it."""

from hicachefs_testing.glusterfs import GlusterVolume
from hicachefs_testing.juicefs import JuiceVolume

ENGINES = {"glusterfs": GlusterVolume, "juicefs": JuiceVolume}
