// mla-decode: Multi-head Latent Attention decode. Include this one header.
#pragma once

#include "mla/decode.h"    // IWYU pragma: export
#include "mla/error.h"     // IWYU pragma: export
#include "mla/exchange.h"  // IWYU pragma: export
#include "mla/merge.h"     // IWYU pragma: export
#include "mla/tensor.h"    // IWYU pragma: export
