// Picks a kernel table from what the running CPU supports.
#include <cstdlib>
#include <stdexcept>
#include <vector>
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__) && (defined(__x86_64__) || defined(_M_X64))
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), and a kernel that can hand out the 8 KiB tile
// state: Linux does so only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, since 5.16), and a tile
// instruction without it dies of SIGILL. Listing asks only whether the state is supported (ARCH_GET_XCOMP_SUPP);
// the request itself is made once the AMX table is chosen (amx_granted), since a granted process may no longer
// install small alternate signal stacks.
constexpr long kArchGetXcompSupp = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

[[maybe_unused]] bool cpu_has_amx_int8() {
#if defined(__linux__) && (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  static const bool ok = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 24) & 1) || !((edx >> 25) & 1)) return false;
    unsigned long features = 0;
    return syscall(SYS_arch_prctl, kArchGetXcompSupp, &features) == 0 && ((features >> kXfeatureXtiledata) & 1);
  }();
  return ok;
#else
  return false;
#endif
}

bool amx_granted() {
#if defined(PYINFER_AMX_EMULATE)
  return true;  // emulated tiles need no tile state
#elif defined(__linux__) && (defined(__x86_64__) || defined(_M_X64))
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
#else
  return false;
#endif
}

std::vector<const KernelTable*> usable() {
  std::vector<const KernelTable*> out;
  // The CPU is asked first: a table's own code (even the copy that builds it) is compiled for its ISA, so
  // calling kernels_avx512() on a CPU without AVX-512 dies of an illegal instruction.
  const bool avx2 = cpu_has_avx2_fma_f16c() && kernels_avx2();
  const bool avx512 = avx2 && cpu_has_avx512_vnni() && kernels_avx512();
#if defined(PYINFER_AMX_EMULATE)
  if (avx2 && kernels_amx()) out.push_back(kernels_amx());  // a development build: AMX's arithmetic, emulated
#else
  if (avx512 && cpu_has_amx_int8() && kernels_amx()) out.push_back(kernels_amx());  // granted in select_kernels
#endif
  if (avx512) out.push_back(kernels_avx512());
  if (avx2) out.push_back(kernels_avx2());
  if (kernels_neon()) out.push_back(kernels_neon());
  out.push_back(&kernels_scalar());
  return out;
}

}  // namespace

const KernelTable& select_kernels(const std::string& isa) {
  const auto tables = usable();
  std::string want = isa.empty() ? "auto" : isa;
  if (want == "auto") {
    const char* env = std::getenv("PYINFER_ISA");
    if (env && *env) want = env;
  }
  // By name: kernels_amx() itself must not run on a CPU without AVX-512.
  const auto is_amx = [](const KernelTable* t) { return std::string(t->isa) == "amx"; };
  if (want == "auto") {
    for (const KernelTable* t : tables)
      if (!is_amx(t) || amx_granted()) return *t;  // a kernel that refuses the tile state: the next table
  }
  for (const KernelTable* t : tables)
    if (want == t->isa) {
      if (is_amx(t) && !amx_granted())
        throw std::invalid_argument("kernel ISA 'amx': the Linux kernel refused this process the AMX tile state");
      return *t;
    }
  throw std::invalid_argument("kernel ISA '" + want + "' is not available on this CPU (available: " +
                              available_isas() + ")");
}

std::string available_isas() {
  std::string s;
  for (const KernelTable* t : usable()) s += (s.empty() ? "" : ",") + std::string(t->isa);
  return s;
}

}  // namespace pyinfer
