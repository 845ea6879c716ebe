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


def test_hugepages_are_tried_and_reported(lib, thp_offered):
    for size in (8 << 20, (5 << 20) + 4096):  # whole huge pages, and a tail of normal ones
        pool = lib.colibri_pool_create(size, 1, -1)
        assert pool != ffi.NULL
        try:
            # hugetlb when a pool is reserved, else THP advice, else normal pages: never a failure
            kind = lib.colibri_pool_page_kind(pool)
            assert kind in (0, 1, 2)
            if thp_offered:
                assert kind in (1, 2)
            assert lib.colibri_pool_capacity(pool) == size
            base = ffi.cast("char *", lib.colibri_pool_alloc(pool, size, 64))
            if kind:  # only a mapping on a 2 MiB boundary can hold huge pages
                assert int(ffi.cast("uintptr_t", base)) % (2 << 20) == 0
            ffi.memmove(base + size - 8, b"x" * 8, 8)  # the last bytes are mapped
        finally:
            lib.colibri_pool_free(pool)


def test_a_pool_under_one_huge_page_keeps_normal_pages(lib):
    pool = lib.colibri_pool_create((2 << 20) - 4096, 1, -1)
    assert pool != ffi.NULL
    try:
        assert lib.colibri_pool_page_kind(pool) == 0
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
