"""The weight arena (kernels/pool.c) through the C API."""
from colibri._lib import ffi, last_error


def test_alloc_is_aligned_and_bounded(lib):
    pool = lib.colibri_pool_create(1 << 20, 0, -1)
    assert pool != ffi.NULL
    try:
        assert lib.colibri_pool_page_kind(pool) == 0  # normal pages when not asked
        a = lib.colibri_pool_alloc(pool, 100, 64)
        b = lib.colibri_pool_alloc(pool, 10, 4096)
        assert int(ffi.cast("uintptr_t", a)) % 64 == 0
        assert int(ffi.cast("uintptr_t", b)) % 4096 == 0
        assert lib.colibri_pool_used(pool) == 4096 + 10
        # slices are usable memory
        ffi.memmove(b, b"x" * 10, 10)
        assert lib.colibri_pool_alloc(pool, 1 << 20, 64) == ffi.NULL
        assert "pool exhausted" in last_error(lib)
        assert lib.colibri_pool_alloc(pool, 8, 3) == ffi.NULL
        assert "power of two" in last_error(lib)
    finally:
        lib.colibri_pool_free(pool)


def test_hugepages_are_tried_and_reported(lib):
    pool = lib.colibri_pool_create(8 << 20, 1, -1)
    assert pool != ffi.NULL
    try:
        # hugetlb when a pool is reserved, else THP advice, else normal pages: never a failure
        assert lib.colibri_pool_page_kind(pool) in (0, 1, 2)
        assert lib.colibri_pool_capacity(pool) == 8 << 20
    finally:
        lib.colibri_pool_free(pool)


def test_bad_arguments_are_errors_not_crashes(lib):
    assert lib.colibri_pool_create(0, 0, -1) == ffi.NULL
    assert "capacity" in last_error(lib)
    assert lib.colibri_pool_create(4096, 7, -1) == ffi.NULL
    assert "hugepages" in last_error(lib)
    assert lib.colibri_pool_create(4096, 0, 60) == ffi.NULL
    assert "NUMA node 60" in last_error(lib)
    assert lib.colibri_pool_alloc(ffi.NULL, 8, 8) == ffi.NULL
    lib.colibri_pool_free(ffi.NULL)  # a no-op, like free(NULL)
