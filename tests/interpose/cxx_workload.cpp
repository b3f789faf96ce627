// A C++ program that knows nothing of ddheap, for the preload tests: the
// standard containers, threads, sized and over-aligned new/delete, every
// libc allocation function, and a library dlopen'ed after start. It prints
// one deterministic line of results, which must be the same with and
// without libddheap_preload.so, traced or not.
//
//     cxx_workload PLUGIN [--wait]
//
// --wait: print "cxx: pid N" and wait for a line on stdin before the work,
// print "cxx: done" and wait for another before exiting (the tests attach
// a tracer in between).
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

struct alignas(64) Tile {
    unsigned char bytes[192];
};

struct Node {
    uint64_t key;
    std::string name;
    Node *next;
};

int failures = 0;

void expect(bool ok, const char *what)
{
    if (!ok) {
        std::fprintf(stderr, "cxx: FAILED %s\n", what);
        failures++;
    }
}

uint64_t containers(unsigned seed)
{
    uint64_t h = seed;
    std::vector<std::string> words;
    for (unsigned i = 0; i < 3000; i++)
        words.push_back(std::string(16 + (i * seed) % 300, char('a' + i % 26)));
    std::map<unsigned, std::string> ordered;
    std::unordered_map<std::string, unsigned> counts;
    for (unsigned i = 0; i < words.size(); i++) {
        ordered[i * 7919u % 4099u] = words[i];
        counts[words[i].substr(0, 20)]++;
    }
    for (auto &kv : ordered)
        h = mix(h, kv.first + kv.second.size());
    for (auto &kv : counts)
        h = mix(h, 0) + kv.second * kv.first.size(); // order-free sum
    Node *list = nullptr;
    for (unsigned i = 0; i < 2000; i++)
        list = new Node{i, std::to_string(i * seed), list}; // sized delete below
    while (list) {
        Node *next = list->next;
        h = mix(h, list->key + list->name.size());
        delete list;
        list = next;
    }
    return h;
}

uint64_t aligned_news()
{
    uint64_t h = 0;
    std::vector<std::unique_ptr<Tile>> tiles;
    for (unsigned i = 0; i < 500; i++) {
        tiles.emplace_back(new Tile); // operator new(size_t, align_val_t)
        expect(reinterpret_cast<uintptr_t>(tiles.back().get()) % 64 == 0, "Tile alignment");
        std::memset(tiles.back()->bytes, int(i & 0xff), sizeof tiles.back()->bytes);
    }
    Tile *many = new Tile[37]; // array form, aligned and sized delete[]
    expect(reinterpret_cast<uintptr_t>(many) % 64 == 0, "Tile[] alignment");
    many[36].bytes[0] = 7;
    h = mix(h, many[36].bytes[0]);
    delete[] many;
    for (auto &t : tiles)
        h = mix(h, t->bytes[5]);
    return h;
}

uint64_t libc_family()
{
    uint64_t h = 0;
    char *m = static_cast<char *>(std::malloc(1000));
    std::memset(m, 1, 1000);
    m = static_cast<char *>(std::realloc(m, 200000)); // grows, contents kept
    expect(m[999] == 1, "realloc keeps contents");
    m = static_cast<char *>(reallocarray(m, 100, 30));
    expect(m[999] == 1, "reallocarray keeps contents");
    expect(malloc_usable_size(m) >= 3000, "malloc_usable_size");
    std::free(m);
    int *z = static_cast<int *>(std::calloc(5000, sizeof(int)));
    for (int i = 0; i < 5000; i++)
        h += z[i]; // all zero
    std::free(z);
    void *p = nullptr;
    expect(posix_memalign(&p, 4096, 10000) == 0 && reinterpret_cast<uintptr_t>(p) % 4096 == 0,
           "posix_memalign");
    std::free(p);
    expect(posix_memalign(&p, 24, 100) == EINVAL, "posix_memalign EINVAL");
    void *a = aligned_alloc(256, 5000);
    expect(a && reinterpret_cast<uintptr_t>(a) % 256 == 0, "aligned_alloc");
    std::free(a);
    void *b = memalign(128, 77);
    expect(b && reinterpret_cast<uintptr_t>(b) % 128 == 0, "memalign");
    std::free(b);
    long page = sysconf(_SC_PAGESIZE);
    void *v = valloc(100);
    expect(v && reinterpret_cast<uintptr_t>(v) % page == 0, "valloc");
    std::free(v);
    void *pv = pvalloc(100);
    expect(pv && malloc_usable_size(pv) >= size_t(page), "pvalloc rounds up to a page");
    std::free(pv);
    // Through a volatile: clang elides a malloc it sees passed straight to
    // realloc, and with it the call this line is about.
    void *volatile ten = std::malloc(10);
    expect(std::realloc(ten, 0) == nullptr, "realloc(p, 0) frees");
    return h;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: cxx_workload PLUGIN [--wait]\n");
        return 2;
    }
    bool wait = argc > 2 && std::strcmp(argv[2], "--wait") == 0;
    std::string line;
    if (wait) {
        std::cout << "cxx: pid " << getpid() << std::endl;
        std::getline(std::cin, line);
    }

    uint64_t per_thread[4] = {};
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; t++)
        threads.emplace_back([t, &per_thread] { per_thread[t] = containers(t + 1); });
    for (auto &th : threads)
        th.join();
    uint64_t h = 0;
    for (uint64_t v : per_thread)
        h = mix(h, v);
    h = mix(h, aligned_news());
    h = mix(h, libc_family());

    // Loaded after start: its allocations must reach the same malloc.
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        std::fprintf(stderr, "cxx: dlopen: %s\n", dlerror());
        return 1;
    }
    using work_fn = uint64_t (*)(unsigned);
    auto work = reinterpret_cast<work_fn>(dlsym(plugin, "dd_interpose_plugin_work"));
    expect(work != nullptr, "plugin symbol");
    if (work)
        h = mix(h, work(1000));
    dlclose(plugin);

    std::cout << "cxx: result " << std::hex << h << std::dec << " failures " << failures << std::endl;
    if (wait) {
        std::cout << "cxx: done" << std::endl;
        std::getline(std::cin, line);
    }
    return failures == 0 ? 0 : 1;
}
