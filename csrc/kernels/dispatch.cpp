// Picks a kernel table from what the running CPU supports.
#include <stdexcept>
#include <vector>

#include "kernels/kernels.h"

namespace pyinfer {
namespace {

bool cpu_has_avx2_fma_f16c() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

std::vector<const KernelTable*> usable() {
  std::vector<const KernelTable*> out;
  // The CPU is asked first: a table's own code (even the copy that builds it) is compiled for its ISA, so
  // calling kernels_avx512() on a CPU without AVX-512 dies of an illegal instruction.
  const bool avx2 = cpu_has_avx2_fma_f16c() && kernels_avx2();
  if (avx2 && cpu_has_avx512_vnni() && kernels_avx512()) out.push_back(kernels_avx512());
  if (avx2) out.push_back(kernels_avx2());
  if (kernels_neon()) out.push_back(kernels_neon());
  out.push_back(&kernels_scalar());
  return out;
}

}  // namespace

const KernelTable& select_kernels(const std::string& isa) {
  const auto tables = usable();
  if (isa.empty() || isa == "auto") return *tables.front();
  for (const KernelTable* t : tables)
    if (isa == t->isa) return *t;
  throw std::invalid_argument("kernel ISA '" + isa + "' is not available on this CPU (available: " +
                              available_isas() + ")");
}

std::string available_isas() {
  std::string s;
  for (const KernelTable* t : usable()) s += (s.empty() ? "" : ",") + std::string(t->isa);
  return s;
}

}  // namespace pyinfer
