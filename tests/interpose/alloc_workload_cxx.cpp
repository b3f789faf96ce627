// The C++ side of alloc_workload.c: operator new and delete in every form
// (plain, array, sized, aligned, nothrow), containers and shared_ptr, in a
// program linked with (or preloading) each allocator. jemalloc, tcmalloc
// and mimalloc define operator new/delete themselves; libstdc++'s, used
// with glibc, calls malloc. Either way every block must be the
// allocator's, its size as the allocator says, and the output the same
// with and without ddheap (tests/interpose/test_allocators.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "alloc_owner.h"

namespace {

std::uint64_t hash;

void mix(const void *p, std::size_t n)
{
    auto b = static_cast<const unsigned char *>(p);
    for (std::size_t i = 0; i < n; i += 61)
        hash = hash * 1099511628211u ^ b[i];
    hash = hash * 31 + n;
}

struct alignas(128) Wide {
    unsigned char bytes[300];
};

void every_form(unsigned round)
{
    std::size_t n = 8 + (round * 53u) % 2000u;
    auto *one = new std::uint64_t(round);
    owned_block(one, sizeof *one, "new");
    auto *many = new char[n];
    owned_block(many, n, "new[]");
    for (std::size_t i = 0; i < n; i++)
        many[i] = char(i * 3 + round);
    mix(many, n);
    auto *wide = new Wide;
    owned_block(wide, sizeof *wide, "aligned new");
    if (reinterpret_cast<std::uintptr_t>(wide) % alignof(Wide) != 0)
        fail("aligned new: alignment");
    wide->bytes[0] = 1;
    auto *wides = new Wide[3];
    owned_block(wides, 3 * sizeof *wides, "aligned new[]");
    auto *quiet = new (std::nothrow) char[n];
    owned_block(quiet, n, "nothrow new[]");
    void *raw = ::operator new(n);
    owned_block(raw, n, "operator new");
    ::operator delete(raw, n); // sized
    delete[] quiet;
    delete[] wides;
    delete wide;
    delete[] many;
    delete one;
}

void containers(unsigned round)
{
    std::vector<std::string> words;
    std::map<std::string, unsigned> counts;
    for (unsigned i = 0; i < 40; i++) {
        words.push_back(std::string(20 + (i * round) % 90, char('a' + i % 26)));
        counts[words.back()] += i;
    }
    owned_block(words.data(), words.size() * sizeof words[0], "vector storage");
    auto shared = std::make_shared<std::vector<int>>(round % 500 + 1, int(round));
    owned_block(shared->data(), shared->size() * sizeof(int), "make_shared's vector");
    for (const auto &kv : counts) {
        mix(kv.first.data(), kv.first.size());
        hash += kv.second;
    }
    mix(shared->data(), shared->size() * sizeof(int));
}

} // namespace

int main()
{
    allocator_setup();
    for (unsigned round = 0; round < 300; round++) {
        every_form(round);
        containers(round);
        allocator_specific(round, mix);
    }
    // A block the allocator's statistics cannot miss, made by new[].
    std::uint64_t before = allocator_stat();
    const std::size_t big = std::size_t(48) << 20;
    auto *block = new unsigned char[big];
    owned_block(block, big, "new[] (big)");
    for (std::size_t i = 0; i < big; i += 4096)
        block[i] = static_cast<unsigned char>(i >> 12);
    std::uint64_t during = allocator_stat();
    if (during < before + big)
        fail("the allocator's own statistics did not see new[] (big)");
    mix(block, big);
    delete[] block;
    // And one through malloc: with the allocator's own operator new (not
    // sampled) this is the block a tracer is sure to see at any interval.
    void *plain = owned_block(std::malloc(big), big, "malloc (big)");
    std::memset(plain, 7, big);
    mix(plain, big);
    std::free(plain);
    std::printf("alloc: allocator %s (C++)\n", ALLOCATOR_NAME);
    std::printf("alloc: result %016llx\n", static_cast<unsigned long long>(hash));
    std::printf("alloc: stat allocated %llu\n", static_cast<unsigned long long>(allocator_stat()));
    std::printf("alloc: stat big_seen %llu\n", static_cast<unsigned long long>(during - before));
    return 0;
}
