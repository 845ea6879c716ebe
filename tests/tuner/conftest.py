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


@pytest.fixture(scope="session")
def checkout_lib():
    """The default library's path, found (or built) before any test points
    $COLIBRI_TEMPLATES_DIR at modified templates. Tuner runs on such templates get it as
    $COLIBRI_LIB: else their binding (quantize_int4k writing the int4 weights) takes the
    copies' new mtimes for newer engine sources and rebuilds the checkout's default library
    from them (slow, and the checkout's library then holds test templates)."""
    from colibri import _lib

    return str(_lib.default_library_path())
