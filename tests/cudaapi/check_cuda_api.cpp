// SPDX-License-Identifier: Apache-2.0
// nvtaskset's own CUDA driver API declarations (cudaapi/include/nvtaskset/
// cuda_driver_api.hpp) against the toolkit's cuda.h, at compile time: a
// difference is a build error naming the declaration. Built only where cmake
// finds a cuda.h (tests/cudaapi/CMakeLists.txt).
//
// Both headers live in one translation unit: ours inside namespace nvt_cuda
// (with C++ linkage, NVTASKSET_CUDA_API_CHECK), cuda.h at global scope. Their
// types are then distinct, so Real<T> rewrites a type built from ours into the
// one built the same way from cuda.h's (Real<nvt_cuda::CUresult(*)(nvt_cuda::
// CUdevice*)> is ::CUresult(*)(::CUdevice*)); every comparison is "the same
// type after that rewriting". What is checked, for every declaration that
// gen_checks.cmake finds in our header (checks.inc):
//   - every typedef names the same type (int is int, a handle is a pointer to
//     the struct behind cuda.h's handle, an alias names the mapped type);
//   - enums: size and underlying type; each enumerator's value and enum;
//   - structs and unions: size, alignment, union-ness, and each member's offset
//     and type;
//   - functions: the whole type (return, every parameter);
//   - CUDA_VERSION: cuda.h's is at least ours (the API ours describes exists).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <type_traits>
#include <utility>

#define NVTASKSET_CUDA_API_CHECK 1
namespace nvt_cuda {
#include "nvtaskset/cuda_driver_api.hpp"
}
constexpr int kOurCudaVersion = CUDA_VERSION;
// cuda.h defines both again.
#undef CUDA_VERSION
#undef CUDAAPI

#include <cuda.h>

namespace {

template <class T>
struct Real {
  using type = T;  // fundamental types; an unmapped nvt_cuda type stays itself and so never matches
};
template <class T>
using real_t = typename Real<T>::type;
template <class T>
struct Real<T*> {
  using type = real_t<T>*;
};
template <class T>
struct Real<const T> {
  using type = const real_t<T>;
};
template <class T, std::size_t N>
struct Real<T[N]> {
  using type = real_t<T>[N];
};
template <class R, class... A>
struct Real<R(A...)> {
  using type = real_t<R>(real_t<A>...);
};

template <class A, class B>
constexpr bool kSame = std::is_same_v<real_t<A>, B>;

// An enumerator's value; a failure names both values in the diagnostic
// (ValueMatches<ours, cuda.h's, ...>). An enumerator named *_MAX counts the
// enumerators of a release: equal when cuda.h is of our CUDA_VERSION, at least
// ours when newer.
template <long long Ours, long long Theirs, bool Sentinel, bool NewerHeader>
struct ValueMatches {
  static constexpr bool value = Ours == Theirs || (Sentinel && NewerHeader && Ours <= Theirs);
  static_assert(value, "enumerator value differs: ours and cuda.h's are the first two template arguments");
};

}  // namespace

// Pass 1: how each of our named types maps to cuda.h's.
namespace {
#define NVT_VERSION(v)
#define NVT_ALIAS(name)
#define NVT_HANDLE(name)                                                   \
  template <>                                                              \
  struct Real<std::remove_pointer_t<nvt_cuda::name>> {                     \
    using type = std::remove_pointer_t<::name>;                            \
  };
#define NVT_ENUM(name)      \
  template <>               \
  struct Real<nvt_cuda::name> { \
    using type = ::name;    \
  };
#define NVT_RECORD(name) NVT_ENUM(name)
#define NVT_ENUMERATOR(e, name)
#define NVT_MEMBER(r, path)
#define NVT_UNNAMED(r, member)
#define NVT_FUNCTION(name)
#include "checks.inc"
}  // namespace
#undef NVT_VERSION
#undef NVT_ALIAS
#undef NVT_HANDLE
#undef NVT_ENUM
#undef NVT_RECORD
#undef NVT_ENUMERATOR
#undef NVT_MEMBER
#undef NVT_UNNAMED
#undef NVT_FUNCTION

// Pass 2: the comparisons.
#define NVT_VERSION(v)                                                                              \
  static_assert(kOurCudaVersion == (v));                                                            \
  static_assert(CUDA_VERSION >= (v), "the toolkit's cuda.h is older than the API nvtaskset declares");
#define NVT_ALIAS(name) static_assert(kSame<nvt_cuda::name, ::name>, "typedef " #name);
#define NVT_HANDLE(name)                                                                           \
  static_assert(std::is_pointer_v<::name> && std::is_class_v<std::remove_pointer_t<::name>>,       \
                "handle " #name " (cuda.h's is a pointer to a struct)");                           \
  static_assert(kSame<nvt_cuda::name, ::name>, "handle " #name);
#define NVT_ENUM(name)                                                                             \
  static_assert(std::is_enum_v<::name>, "enum " #name " (not an enum in cuda.h)");                 \
  static_assert(sizeof(nvt_cuda::name) == sizeof(::name), "size of enum " #name);                  \
  static_assert(std::is_same_v<std::underlying_type_t<nvt_cuda::name>, std::underlying_type_t<::name>>, \
                "underlying type of enum " #name);
#define NVT_RECORD(name)                                                                           \
  static_assert(sizeof(nvt_cuda::name) == sizeof(::name), "size of " #name);                       \
  static_assert(alignof(nvt_cuda::name) == alignof(::name), "alignment of " #name);                \
  static_assert(std::is_union_v<nvt_cuda::name> == std::is_union_v<::name>, "union or struct: " #name); \
  static_assert(std::is_standard_layout_v<nvt_cuda::name>, #name " must be a C layout");
#define NVT_ENUMERATOR(e, name)                                                                    \
  static_assert(kSame<decltype(nvt_cuda::name), decltype(::name)>, #name " belongs to " #e);       \
  static_assert(std::is_same_v<decltype(nvt_cuda::name), nvt_cuda::e>, #name " is declared in " #e); \
  static_assert(ValueMatches<static_cast<long long>(nvt_cuda::name), static_cast<long long>(::name), \
                             std::string_view(#name).ends_with("_MAX"), (CUDA_VERSION > kOurCudaVersion)>::value, \
                "value of " #name);
#define NVT_MEMBER(r, path)                                                                        \
  static_assert(offsetof(nvt_cuda::r, path) == offsetof(::r, path), "offset of " #r "." #path);    \
  static_assert(kSame<decltype(std::declval<nvt_cuda::r&>().path), decltype(std::declval<::r&>().path)>, \
                "type of " #r "." #path);
#define NVT_UNNAMED(r, member)                                                                     \
  static_assert(offsetof(nvt_cuda::r, member) == offsetof(::r, member), "offset of " #r "." #member); \
  static_assert(sizeof(nvt_cuda::r::member) == sizeof(::r::member), "size of " #r "." #member);
#define NVT_FUNCTION(name) static_assert(kSame<decltype(nvt_cuda::name), decltype(::name)>, "signature of " #name);
#include "checks.inc"

int main() {
  constexpr int counts[] = {NVT_COUNTS};
  // A generator that found nothing would check nothing.
  static_assert(counts[0] > 0 && counts[1] > 0 && counts[2] > 0 && counts[3] > 0);
  std::printf("nvtaskset's CUDA driver API declarations (CUDA_VERSION %d) match cuda.h (CUDA_VERSION %d): "
              "%d types, %d enumerators, %d members, %d functions\n",
              kOurCudaVersion, CUDA_VERSION, counts[0], counts[1], counts[2], counts[3]);
  return 0;
}
