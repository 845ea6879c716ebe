/* expert_cache.h — the expert cache's constructor, for the model loader (model.c); the
 * forward path's calls are in internal.h. */
#ifndef COLIBRI_EXPERT_CACHE_H
#define COLIBRI_EXPERT_CACHE_H

#include "internal.h"
#include "model_file.h"

/* A cache of the experts of layers[0 .. mf's n_layers) holding as many as fit in
 * budget_for_experts beside its staging buffers, read from fd (the file mf describes; both
 * must outlive the cache) as o asks (colibri_load_options: skip_crc, io_threads,
 * read_depth, direct_io, policy; checked by the caller). NULL with the error set when not
 * even one expert fits or memory runs out. */
cb_cache *cb_cache_create(const cb_model_file *mf, int fd, colibri_layer *layers, size_t budget_for_experts,
                          const colibri_load_options *o);

#endif
