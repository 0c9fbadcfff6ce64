// Compiles the CuTe pieces the sm90 backend builds on (TMA copy atoms, GMMA traits) for sm_90a with
// the pinned CUTLASS and this CUDA toolkit. Built by the test suite; nothing is run.
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace mla_build_check {

using namespace cute;

// One 64x576 bf16 K tile in a 128-byte-swizzled shared-memory layout, as a decode kernel stages it.
using KTileLayout =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<Int<64>, Int<576>>{}));
static_assert(cosize_v<KTileLayout> == 64 * 576, "K tile layout must be dense");

__global__ void k_tile_size(int* out) { out[threadIdx.x] = static_cast<int>(size(KTileLayout{})); }

}  // namespace mla_build_check
