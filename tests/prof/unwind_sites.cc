// The plain `g++ -O2` program of test_unwind.py: vectors, maps, strings
// and new from five named functions, run under the preload library. The
// containers allocate through a counting allocator that only records the
// size and calls ::operator new (it is inlined: the stacks are those of
// the standard containers), so the program knows its own bytes per
// function. Writes "function size count" lines to TRUTH_FILE.
//
//   unwind_sites_cxx TRUTH_FILE [SCALE]
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace {

const int kMaxSizes = 64;
struct Truth {
    const char *function;
    std::size_t size[kMaxSizes];
    unsigned long count[kMaxSizes];
};
Truth truths[5] = {{"make_vectors", {}, {}}, {"make_maps", {}, {}}, {"make_strings", {}, {}},
                   {"make_records", {}, {}}, {"make_arrays", {}, {}}};
Truth *current;
volatile unsigned long sink;

void record(std::size_t size)
{
    for (int i = 0; i < kMaxSizes; i++)
        if (current->size[i] == size || current->size[i] == 0) {
            current->size[i] = size;
            current->count[i]++;
            return;
        }
    std::abort();
}

template <class T> struct Counting {
    using value_type = T;
    Counting() = default;
    template <class U> Counting(const Counting<U> &) {}
    T *allocate(std::size_t n)
    {
        record(n * sizeof(T));
        return static_cast<T *>(::operator new(n * sizeof(T)));
    }
    void deallocate(T *p, std::size_t) { ::operator delete(p); }
};
template <class T, class U> bool operator==(const Counting<T> &, const Counting<U> &) { return true; }
template <class T, class U> bool operator!=(const Counting<T> &, const Counting<U> &) { return false; }

using String = std::basic_string<char, std::char_traits<char>, Counting<char>>;

struct Record {
    char data[512];
};

}  // namespace

__attribute__((noinline)) void make_vectors(int n)
{
    current = &truths[0];
    for (int i = 0; i < n; i++) {
        std::vector<int, Counting<int>> v;
        for (int k = 0; k < 300; k++)
            v.push_back(k);
        sink += v.size();
    }
    sink++;
}

__attribute__((noinline)) void make_maps(int n)
{
    current = &truths[1];
    for (int i = 0; i < n; i++) {
        std::map<int, long, std::less<int>, Counting<std::pair<const int, long>>> m;
        for (int k = 0; k < 64; k++)
            m[k] = k;
        sink += m.size();
    }
    sink++;
}

__attribute__((noinline)) void make_strings(int n)
{
    current = &truths[2];
    for (int i = 0; i < n; i++) {
        String s(200 + i % 50, 'x');
        sink += s.size();
    }
    sink++;
}

__attribute__((noinline)) void make_records(int n)
{
    current = &truths[3];
    for (int i = 0; i < n; i++) {
        record(sizeof(Record));
        Record *r = new Record;
        r->data[0] = 1;
        sink += r->data[0];
        delete r;
    }
    sink++;
}

__attribute__((noinline)) void make_arrays(int n)
{
    current = &truths[4];
    for (int i = 0; i < n; i++) {
        record(1000 * sizeof(double));
        double *a = new double[1000];
        a[0] = 1;
        sink += static_cast<unsigned long>(a[0]);
        delete[] a;
    }
    sink++;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: unwind_sites_cxx TRUTH_FILE [SCALE]\n");
        return 2;
    }
    int n = argc > 2 ? std::atoi(argv[2]) : 20000;
    make_vectors(n);
    make_maps(n);
    make_strings(n);
    make_records(n);
    make_arrays(n);
    std::FILE *f = std::fopen(argv[1], "w");
    if (f == nullptr)
        return 1;
    for (const Truth &t : truths)
        for (int i = 0; i < kMaxSizes && t.size[i]; i++)
            std::fprintf(f, "%s %zu %lu\n", t.function, t.size[i], t.count[i]);
    std::fclose(f);
    std::printf("%lu\n", sink);
    return 0;
}
