import pytest


@pytest.fixture(scope="session")
def probe_lib(tmp_path_factory):
    """The host's default library if it has the probe kernels (membw.c, peak.c), else a
    fresh build of the host's profile (a library loaded before they existed cannot be
    reloaded)."""
    from colibri import _lib
    from colibri_build import hostid
    from tuner.host import bandwidth, peak

    lib = _lib.open_library(_lib.default_library_path())
    if all(hasattr(lib, s) for s in (bandwidth.SYMBOL, peak.SYMBOL)):
        return lib
    built = _lib.build_profile(hostid.host_profile_name(),
                               build_dir=tmp_path_factory.mktemp("build"), quiet=True)
    return _lib.open_library(built)
