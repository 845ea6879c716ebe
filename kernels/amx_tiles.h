/* amx_tiles.h — the AMX tile operations the kernels use, as macros (CB_TILE_*).
 *
 * Where the compiler targets AMX they are the instructions themselves (<immintrin.h>).
 * Under CB_AMX_EMULATED (profile sapphirerapids-amx-emulated) they call amx_emu.c, a tile
 * unit in plain C with the ISA's defined semantics, so that the same kernel text is
 * verified on any x86 host: AMX hosts are rare, the kernels' correctness must not be.
 * Tile numbers are literals in both cases (the instructions encode them). */
#ifndef COLIBRI_AMX_TILES_H
#define COLIBRI_AMX_TILES_H

#include <stddef.h>
#include <stdint.h>

/* The 64-byte tile configuration LDTILECFG reads (palette 1: 8 tiles, 16 rows x 64 bytes
 * at most). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cb_tilecfg;

/* The emulated unit (amx_emu.c; always built, so its test links any library). A refused
 * operation (an unconfigured tile, shapes the instruction does not accept, a tile number
 * past 7) does nothing and calls the fault handler: by default it prints the reason and
 * aborts, as the instruction would fault; a test can install its own. */
void cb_emu_loadconfig(const void *cfg);
void cb_emu_release(void);
void cb_emu_zero(int t);
void cb_emu_loadd(int t, const void *base, size_t stride);
void cb_emu_stored(int t, void *base, size_t stride);
void cb_emu_dpbf16ps(int c, int a, int b);
/* int8 products: a's and b's bytes signed (s) or unsigned (u), in that order */
void cb_emu_dpbssd(int c, int a, int b);
void cb_emu_dpbsud(int c, int a, int b);
void cb_emu_dpbusd(int c, int a, int b);
void cb_emu_dpbuud(int c, int a, int b);
/* Tile products issued so far by every thread (tests count the work a path does). */
unsigned long long cb_emu_products(void);
typedef void (*cb_emu_fault_fn)(const char *why);
/* Installs fn (NULL: the default, print and abort); returns the previous handler. */
cb_emu_fault_fn cb_emu_on_fault(cb_emu_fault_fn fn);

/* Whether this process may run tile instructions: Linux grants the tile state on request
 * (amx_perm.c); the emulated unit needs no grant. */
#if defined(CB_AMX_EMULATED)
static inline int cb_tiles_ready(void) { return 1; }
#else
int cb_amx_granted(void);
static inline int cb_tiles_ready(void) { return cb_amx_granted(); }
#endif

#if defined(CB_AMX_EMULATED)
#define CB_TILE_LOADCONFIG(cfg) cb_emu_loadconfig(cfg)
#define CB_TILE_RELEASE() cb_emu_release()
#define CB_TILE_ZERO(t) cb_emu_zero(t)
#define CB_TILE_LOADD(t, base, stride) cb_emu_loadd(t, base, stride)
#define CB_TILE_STORED(t, base, stride) cb_emu_stored(t, base, stride)
#define CB_TILE_DPBF16PS(c, a, b) cb_emu_dpbf16ps(c, a, b)
#define CB_TILE_DPBSSD(c, a, b) cb_emu_dpbssd(c, a, b)
#define CB_TILE_DPBSUD(c, a, b) cb_emu_dpbsud(c, a, b)
#define CB_TILE_DPBUSD(c, a, b) cb_emu_dpbusd(c, a, b)
#define CB_TILE_DPBUUD(c, a, b) cb_emu_dpbuud(c, a, b)
#elif defined(__AMX_TILE__)
#include <immintrin.h>
/* The three operations that touch memory are our own asm, not <immintrin.h>'s: gcc 12's
 * forms tell the compiler that ldtilecfg reads 8 bytes of the configuration and that
 * tileloadd and tilestored touch no memory at all. It may then drop the configuration's
 * column and row stores as dead (a build did: ldtilecfg read stack garbage and faulted), sink
 * the activations' stores past the tile loads that read them, or read a C buffer before the
 * tile store that fills it. Here ldtilecfg reads the whole 64 bytes, and the loads and
 * stores clobber memory (a compiler barrier; the tile work per operation dwarfs it). */
#define CB_TILE_LOADCONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(const cb_tilecfg *)(cfg)))
#define CB_TILE_RELEASE() _tile_release()
#define CB_TILE_ZERO(t) _tile_zero(t)
#define CB_TILE_LOADD(t, base, stride)                                                         \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)), "r"((long)(stride)) \
                     : "memory")
#define CB_TILE_STORED(t, base, stride)                                                        \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) \
                     : "memory")
#define CB_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define CB_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define CB_TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define CB_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define CB_TILE_DPBUUD(c, a, b) _tile_dpbuud(c, a, b)
#endif

#endif
