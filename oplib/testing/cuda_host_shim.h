// Host shim for CUDA kernel sources: with it, g++ compiles a .cu file unchanged, and
// oplib_emulation runs a kernel over its whole grid on the CPU.
//
// Blocks run in parallel as OpenMP threads, one OS thread running one block at a time. How a
// block's threads run depends on the kernel (oplib.testing.cuda_emulation decides from the
// source's text):
//
// - a kernel whose threads never wait for each other runs them one after another
//   (oplib_emulation::launch), as fast as plain loops;
// - a kernel that uses shared memory, __syncthreads, __syncwarp or warp shuffles runs each
//   thread as a fiber on its block's OS thread (oplib_emulation::launch_fibers). Between two
//   block barriers the warps run one after another, each as far as it can: its lanes in turn,
//   each until it waits or returns, a warp collective released as soon as every lane its mask
//   names waits at it (the same call). A barrier releases when every thread of the block waits
//   at the same one. No warp sees another's work before a barrier, nothing runs concurrently
//   inside a block (a run is deterministic), and a block whose threads can never all arrive (a
//   barrier some threads skip or return before, a shuffle some lanes skip, a mask that leaves
//   out the lane it is read from) ends the launch with an error that says where, not a hang.
//
// The run order (warps, and lanes within a warp, ascending or descending) is a launch
// argument: a missing barrier shows whichever way its race goes, since in one of the two
// orders the reading thread runs before the writing one. A third order, interleaved, runs the
// warps ascending in turns, each to its next wait (a warp collective, a barrier, its end)
// before the next warp's turn: a warp whose shared memory another warp writes between two of
// its collectives (a staging that runs past its own share) sees the other's values there, as
// on a GPU, where in the two orders above it finished before the other began.
//
// Shared memory: a `__shared__` variable is `static thread_local` here (one OS thread runs
// one block at a time); dynamic shared memory, OPLIB_DYNAMIC_SHARED (declared for the GPU in
// warp.cuh), is a heap buffer of exactly the launch's bytes, allocated per block and filled
// with 0xff bytes (a NaN in every floating type) so that a read before any write shows in the
// results, and a read or write past its end is AddressSanitizer's heap-buffer-overflow.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

// How a fiber's context is switched: on x86-64 by the few instructions below (a switch costs
// nanoseconds); elsewhere, or with OPLIB_EMULATION_UCONTEXT defined, by POSIX's
// makecontext/swapcontext, whose switch also saves the signal mask (a system call).
#if defined(__x86_64__) && !defined(OPLIB_EMULATION_UCONTEXT)
#define OPLIB_EMULATION_X86_64_SWITCH 1
#else
#include <ucontext.h>
#endif

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

// Each emulated CUDA thread sees its own indices; thread_local lets blocks run in parallel (a
// block's fibers share its OS thread, and the scheduler sets threadIdx before each runs).
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

constexpr int warpSize = 32;

template <typename T>
inline T __ldg(const T* pointer) {
    return *pointer;
}

inline float __uint_as_float(unsigned int bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline unsigned int __float_as_uint(float value) {
    unsigned int bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

inline float rintf(float value) {
    return std::nearbyint(value);  // round half to even in the default rounding mode, as on the GPU
}

namespace oplib_emulation {

// The threads of a block one after another, ascending or descending by linear index
// (x fastest), each from its start to its end.
template <typename Body>
void run_in_order(const unsigned int* block, bool descending, Body body) {
    const auto index = [descending](unsigned int i, unsigned int size) { return descending ? size - 1 - i : i; };
    for (unsigned int z = 0; z < block[2]; ++z) {
        for (unsigned int y = 0; y < block[1]; ++y) {
            for (unsigned int x = 0; x < block[0]; ++x) {
                threadIdx = {index(x, block[0]), index(y, block[1]), index(z, block[2])};
                body();
            }
        }
    }
}

inline void set_block(long long b, const unsigned int* grid, const unsigned int* block) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    blockIdx = {(unsigned int)(b % grid[0]), (unsigned int)(b / grid[0] % grid[1]),
                (unsigned int)(b / ((long long)grid[0] * grid[1]))};
}

// The run orders, as the launchers' `order` argument numbers them (oplib.testing.cuda_emulation's
// ORDERS and INTERLEAVED).
enum Order { order_ascending = 0, order_descending = 1, order_interleaved = 2 };

// Run ``body`` once per thread of a grid of grid[0..2] blocks of block[0..2] threads, the
// threads of a block one after another (ascending where `order` is interleaved: they never
// wait). Returns no error (nullptr): a kernel on this path cannot deadlock.
template <typename Body>
const char* launch(const unsigned int* grid, const unsigned int* block, long long shared_bytes, int order, Body body) {
    (void)shared_bytes;
    const long long blocks = (long long)grid[0] * grid[1] * grid[2];
#pragma omp parallel for schedule(dynamic)
    for (long long b = 0; b < blocks; ++b) {
        set_block(b, grid, block);
        run_in_order(block, order == order_descending, body);
    }
    return nullptr;
}

// ---------------------------------------------------------------------------------------
// Fibers: the threads of a block that cooperate
// ---------------------------------------------------------------------------------------

// Each fiber's stack, below a guard page (an overflow faults instead of corrupting the next
// stack). CUDA gives a thread 1 KiB by default; host frames are larger, and AddressSanitizer's
// larger still.
constexpr size_t STACK_BYTES = 64 * 1024;

// What a call of a CUDA built-in is, for the scheduler and its error messages.
struct Site {
    const char* what;
    const char* file;
    int line;

    // The same call's strings are one literal (one address) almost always: compared by address
    // first, by text only where the addresses differ (strcmp was 7% of an emulated run's time).
    bool operator==(const Site& other) const {
        return line == other.line && (what == other.what || std::strcmp(what, other.what) == 0) &&
               (file == other.file || std::strcmp(file, other.file) == 0);
    }
};

// A stack a context runs on, and AddressSanitizer's record of it while it is switched out.
struct Context {
#ifdef OPLIB_EMULATION_X86_64_SWITCH
    void* stack_pointer = nullptr;  // where switch_stack saved the registers
#else
    ucontext_t context{};
#endif
    const void* bottom = nullptr;
    size_t size = 0;
    void* fake_stack = nullptr;
};

#ifdef OPLIB_EMULATION_X86_64_SWITCH
// Push the callee-saved registers (and the SSE and x87 control words) of the System V ABI on
// this stack, save its pointer in *save, load `load`'s and pop the same from there.
__attribute__((naked, noinline)) static void switch_stack(void** /* save: %rdi */, void* /* load: %rsi */) {
    asm volatile(
        "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
        "subq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n\t"
        "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
        "ldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n\t"
        "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret");
}
#endif

// Make `context` (its stack set) start at `entry` when first switched to.
inline void start_context(Context& context, void (*entry)()) {
#ifdef OPLIB_EMULATION_X86_64_SWITCH
    // The frame switch_stack pops: control words, six registers, then `entry` as the return
    // address, above it a null one for `entry` (which never returns), so that `entry` starts
    // with the stack aligned as after a call.
    void** top = reinterpret_cast<void**>(static_cast<char*>(const_cast<void*>(context.bottom)) + context.size);
    *--top = nullptr;
    *--top = reinterpret_cast<void*>(entry);
    for (int i = 0; i < 6; ++i) *--top = nullptr;
    unsigned int control[2] = {0, 0};
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
    *--top = nullptr;
    std::memcpy(top, control, sizeof control);  // mxcsr, then the x87 control word
    context.stack_pointer = top;
#else
    getcontext(&context.context);
    context.context.uc_stack.ss_sp = const_cast<void*>(context.bottom);
    context.context.uc_stack.ss_size = context.size;
    context.context.uc_link = nullptr;
    makecontext(&context.context, entry, 0);
#endif
}

inline void swap_context(Context& from, Context& to) {
#ifdef OPLIB_EMULATION_X86_64_SWITCH
    // Other fibers read and write memory meanwhile: no value may be kept across the switch.
    asm volatile("" ::: "memory");
    switch_stack(&from.stack_pointer, to.stack_pointer);
    asm volatile("" ::: "memory");
#else
    swapcontext(&from.context, &to.context);
#endif
}

enum class State { runnable, block_barrier, warp_collective, finished };

struct Fiber {
    Context context;
    bool armed = false;  // its context is inside fiber_main, ready for a block's body
    State state = State::finished;
    Site site{"", "", 0};  // where it waits
    unsigned int mask = 0;  // a warp collective's lanes
    int source = 0;  // the lane whose value it takes
    unsigned long long value = 0, result = 0;  // its offer, and what it gets

    Fiber() {
        const size_t guard = (size_t)sysconf(_SC_PAGESIZE);
        void* memory = mmap(nullptr, guard + STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) {
            std::fprintf(stderr, "oplib emulation: cannot map a fiber stack\n");
            std::abort();
        }
        mprotect(memory, guard, PROT_NONE);
        context.bottom = static_cast<char*>(memory) + guard;
        context.size = STACK_BYTES;
    }

    ~Fiber() {
        const size_t guard = (size_t)sysconf(_SC_PAGESIZE);
        munmap(const_cast<char*>(static_cast<const char*>(context.bottom)) - guard, guard + STACK_BYTES);
    }

    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;
};

// This OS thread's fibers, kept from block to block and launch to launch: a fiber that ran a
// body to its end waits inside fiber_main for the next block's.
inline thread_local std::vector<std::unique_ptr<Fiber>> fiber_pool;

class Block;
inline thread_local Block* current_block = nullptr;

void fiber_main();

// Save the running context in `from` and run `to`; returns when something switches back. A
// fiber that returned from a block's body is resumed by a later block, so what runs after the
// switch reads current_block, never the Block it switched from.
inline void transfer(Context& from, Context& to);

// One block's threads as fibers on this OS thread, run by `run` in the block's run order.
class Block {
  public:
    Block(const unsigned int* block, long long shared_bytes, int order, void (*body)(void*), void* closure)
        : body_(body), closure_(closure), dims_{block[0], block[1], block[2]},
          threads_((int)(block[0] * block[1] * block[2])), descending_(order == order_descending),
          interleaved_(order == order_interleaved),
          shared_((unsigned char*)std::malloc((size_t)shared_bytes)), shared_bytes_(shared_bytes) {
        if (shared_bytes > 0) std::memset(shared_, 0xff, (size_t)shared_bytes);
        while ((int)fiber_pool.size() < threads_) fiber_pool.push_back(std::make_unique<Fiber>());
        fibers_ = fiber_pool.data();
    }

    ~Block() { std::free(shared_); }

    // Run every thread to its end: true, or false where they cannot all get there (error()
    // says why). Between two block barriers the warps run one after another in the run order,
    // each as far as it can (through its warp collectives), as if the others had not started;
    // interleaved, in turns, each to its next wait, until none can run.
    bool run() {
        current_block = this;
        for (int t = 0; t < threads_; ++t) arm(*fibers_[t]);
        const int warps = (threads_ + warpSize - 1) / warpSize;
        bool finished = false;
        while (!finished && error_.empty()) {
            if (interleaved_) {
                for (bool ran = true; ran && error_.empty();) {
                    ran = false;
                    for (int w = 0; w < warps && error_.empty(); ++w) ran = step_warp(w) || ran;
                }
            } else {
                for (int w = 0; w < warps && error_.empty(); ++w) run_warp(descending_ ? warps - 1 - w : w);
            }
            finished = std::all_of(fibers_, fibers_ + threads_,
                                   [](const auto& f) { return f->state == State::finished; });
            if (!finished && error_.empty()) release_barrier();
        }
        current_block = nullptr;
        if (error_.empty()) return true;
        // The fibers left waiting never resume: the next block starts them afresh.
        for (int t = 0; t < threads_; ++t) {
            if (fibers_[t]->state != State::finished) fibers_[t]->armed = false;
        }
        return false;
    }

    const std::string& error() const { return error_; }
    unsigned char* shared() const { return shared_; }

    // An ldmatrix row's address as the hardware takes it: 16 bytes of the block's dynamic
    // shared memory, 16-byte aligned (a global address, or a misaligned one, faults there).
    void check_matrix_row(const void* row, const Site& site) {
        const unsigned char* at = static_cast<const unsigned char*>(row);
        if (at < shared_ || at + 16 > shared_ + shared_bytes_) {
            fail(describe(site) + ": a row address outside the block's shared memory");
        }
        if ((at - shared_) % 16 != 0) fail(describe(site) + ": a row address not 16-byte aligned");
    }

    [[noreturn]] void matrix_row_raced(const Site& site) {
        fail(describe(site) + ": lane " + std::to_string(running_lane()) + "'s row was written by another lane after this "
             "lane reached the load (a __syncwarp missing between the writes and the load)");
    }

    // The running thread waits at a __syncthreads.
    void block_barrier(const Site& site) {
        Fiber& self = *fibers_[running_];
        self.state = State::block_barrier;
        self.site = site;
        wait();
    }

    // The running thread offers `value` to a warp collective over the lanes of `mask`, and
    // gets the value lane `source` offered.
    unsigned long long warp_collective(const Site& site, unsigned int mask, unsigned long long value, int source) {
        Fiber& self = *fibers_[running_];
        if (!(mask >> lane(running_) & 1u)) {
            fail(describe(site) + ": the mask " + hex(mask) + " leaves out the calling lane " +
                 std::to_string(lane(running_)) + " (thread " + std::to_string(running_) + ")");
        }
        self.state = State::warp_collective;
        self.site = site;
        self.mask = mask;
        self.value = value;
        self.source = source;
        wait();
        return self.result;
    }

    int running_lane() const { return lane(running_); }

    // Stop the block with `message`: the running thread never resumes.
    [[noreturn]] void fail(const std::string& message) {
        if (error_.empty()) error_ = message;
        for (;;) switch_to_scheduler();
    }

    // Called after every switch, on the context switched to: AddressSanitizer learns that
    // this stack runs now (`fake_stack`: what this context's switch away saved), and the
    // block the bounds of the scheduler's stack when the switch came from there.
    void landed(void* fake_stack) {
#ifdef __SANITIZE_ADDRESS__
        const void* bottom;
        size_t size;
        __sanitizer_finish_switch_fiber(fake_stack, &bottom, &size);
        if (from_scheduler_) {
            scheduler_.bottom = bottom;
            scheduler_.size = size;
        }
#else
        (void)fake_stack;
#endif
        from_scheduler_ = false;
    }

    // The running thread returned from the kernel.
    void finished() {
        fibers_[running_]->state = State::finished;
        wait();
    }

    void run_body() { body_(closure_); }

  private:
    void arm(Fiber& fiber) {
        fiber.state = State::runnable;
        if (fiber.armed) return;
#ifdef __SANITIZE_ADDRESS__
        // Frames a failed block left on the stack keep their poisoned redzones.
        ASAN_UNPOISON_MEMORY_REGION(fiber.context.bottom, fiber.context.size);
#endif
        start_context(fiber.context, fiber_main);
        fiber.armed = true;
    }

    int lane(int t) const { return t % warpSize; }
    // Lane `l` of a warp of `lanes` lanes is the position(l, lanes)-th in the run order.
    int position(int l, int lanes) const { return descending_ ? lanes - 1 - l : l; }

    // The first runnable lane of warp `w` after thread `t` in the run order (-1: from the
    // warp's first), or -1.
    int next_runnable(int w, int t) const {
        const int base = w * warpSize, lanes = std::min(warpSize, threads_ - base);
        for (int p = t < 0 ? 0 : position(t - base, lanes) + 1; p < lanes; ++p) {
            const int next = base + position(p, lanes);  // the order is its own inverse
            if (fibers_[next]->state == State::runnable) return next;
        }
        return -1;
    }

    // Run warp `w`'s lanes, in the run order, until none can run: each runs until it waits
    // or returns; then every warp collective all of whose lanes arrived releases them, and
    // they run again.
    void run_warp(int w) {
        while (step_warp(w)) {
        }
    }

    // One turn of warp `w`: its runnable lanes in the run order, each until it waits or
    // returns, then the release of every warp collective all of whose lanes arrived. False
    // where no lane could run, or on an error.
    bool step_warp(int w) {
        const int first = next_runnable(w, -1);
        if (first < 0) return false;
        from_scheduler_ = true;
        switch_to(scheduler_, first);
        if (!error_.empty()) return false;
        const int base = w * warpSize, lanes = std::min(warpSize, threads_ - base);
        for (int t = base; t < base + lanes; ++t) {
            if (fibers_[t]->state == State::warp_collective && !release_collective(t)) return false;
        }
        return true;
    }

    void switch_to(Context& from, int t) {
        running_ = t;
        threadIdx = {(unsigned int)t % dims_.x, (unsigned int)t / dims_.x % dims_.y,
                     (unsigned int)t / (dims_.x * dims_.y)};
        transfer(from, fibers_[t]->context);
    }

    void switch_to_scheduler() { transfer(fibers_[running_]->context, scheduler_); }

    // The running thread waits: the next runnable lane of its warp in the run order runs, or,
    // at the end of the warp's pass, the scheduler releases what it can.
    void wait() {
        Fiber& self = *fibers_[running_];
        const int next = next_runnable(running_ / warpSize, running_);
        if (next >= 0) {
            switch_to(self.context, next);
        } else {
            switch_to_scheduler();
        }
    }

    // With every thread waiting at a block barrier or returned: release the barrier if every
    // thread waits at the same one, else (error_) the block can never finish.
    void release_barrier() {
        const Fiber* waiting = nullptr;
        bool uniform = true, any_finished = false;
        for (int t = 0; t < threads_; ++t) {
            const Fiber& fiber = *fibers_[t];
            if (fiber.state == State::finished) {
                any_finished = true;
            } else if (waiting == nullptr) {
                waiting = &fiber;
            } else if (!(fiber.site == waiting->site)) {
                uniform = false;
            }
        }
        if (uniform && !any_finished) {
            for (int t = 0; t < threads_; ++t) fibers_[t]->state = State::runnable;
            return;
        }
        error_ = describe(waiting->site) + " is not reached by every thread of the block: " + census();
    }

    // Release the collective thread `t` waits at, where every lane of its mask waits there too;
    // false (error_) where one never will (with no lane of the warp left to run).
    bool release_collective(int t) {
        const Fiber& fiber = *fibers_[t];
        const int base = t - lane(t);
        const int lanes = std::min(warpSize, threads_ - base);  // the last warp of a block may be partial
        const unsigned int present = lanes == warpSize ? 0xffffffffu : (1u << lanes) - 1u;
        const unsigned int members = fiber.mask & present;
        for (int l = 0; l < lanes; ++l) {
            const Fiber& other = *fibers_[base + l];
            if (!(members >> l & 1u)) continue;
            if (other.state != State::warp_collective || !(other.site == fiber.site) || other.mask != fiber.mask) {
                error_ = describe(fiber.site) + " with mask " + hex(fiber.mask) + " in warp " +
                         std::to_string(base / warpSize) + " is not reached by every lane it names: " + census();
                return false;
            }
            if (!(members >> other.source & 1u)) {
                error_ = describe(fiber.site) + ": lane " + std::to_string(l) + " of warp " +
                         std::to_string(base / warpSize) + " reads lane " + std::to_string(other.source) +
                         ", which " + (other.source < lanes ? "the mask " + hex(fiber.mask) + " leaves out" :
                                                                "the block does not have");
                return false;
            }
        }
        for (int l = 0; l < lanes; ++l) {
            if (!(members >> l & 1u)) continue;
            Fiber& other = *fibers_[base + l];
            other.result = fibers_[base + other.source]->value;
            other.state = State::runnable;
        }
        return true;
    }

    static std::string describe(const Site& site) {
        const char* slash = std::strrchr(site.file, '/');
        return std::string(site.what) + " at " + (slash ? slash + 1 : site.file) + ":" + std::to_string(site.line);
    }

    static std::string hex(unsigned int value) {
        char text[16];
        std::snprintf(text, sizeof text, "0x%08x", value);
        return text;
    }

    // Which threads wait where, and which returned: "threads 0-127 wait at __syncthreads at
    // x.cu:40; threads 128-255 returned".
    std::string census() const {
        std::vector<std::pair<std::string, std::vector<int>>> groups;
        for (int t = 0; t < threads_; ++t) {
            const Fiber& fiber = *fibers_[t];
            const std::string where = fiber.state == State::finished ? "returned" : "wait at " + describe(fiber.site);
            auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == where; });
            if (group == groups.end()) {
                groups.push_back({where, {}});
                group = groups.end() - 1;
            }
            group->second.push_back(t);
        }
        std::string text;
        for (const auto& [where, threads] : groups) {
            if (!text.empty()) text += "; ";
            text += "threads " + ranges(threads) + " " + where;
        }
        return text;
    }

    static std::string ranges(const std::vector<int>& sorted) {
        std::string text;
        for (size_t i = 0; i < sorted.size();) {
            size_t j = i;
            while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
            if (!text.empty()) text += ",";
            text += std::to_string(sorted[i]) + (j > i ? "-" + std::to_string(sorted[j]) : "");
            i = j + 1;
        }
        return text;
    }

    void (*body_)(void*);
    void* closure_;
    dim3 dims_;
    int threads_;
    bool descending_, interleaved_;
    unsigned char* shared_;
    long long shared_bytes_;
    // fiber_pool's fibers, which no other Block grows while this one runs (one a thread at a
    // time): a thread_local with a constructor is a call to its TLS wrapper and __tls_get_addr
    // at each use, and the scheduler's loops over a warp's lanes used it at each lane (a fifth
    // of an emulated run's time).
    std::unique_ptr<Fiber>* fibers_ = nullptr;
    Context scheduler_;  // the OS thread's own stack, where run() switches from
    bool from_scheduler_ = false;
    int running_ = -1;
    std::string error_;
};

// Every fiber's entry: run the current block's body, report the return, and when a later
// block resumes this fiber, run that one's.
inline void fiber_main() {
    current_block->landed(nullptr);
    for (;;) {
        Block& block = *current_block;
        block.run_body();
        block.finished();
    }
}

inline void transfer(Context& from, Context& to) {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_start_switch_fiber(&from.fake_stack, to.bottom, to.size);
#endif
    swap_context(from, to);
    current_block->landed(from.fake_stack);
}

inline Block& running_block(const char* what) {
    if (current_block == nullptr) {
        std::fprintf(stderr,
                     "oplib emulation: %s in a kernel launched without fibers (oplib.testing.cuda_emulation."
                     "cooperative decides from the source's text which kernels need them)\n",
                     what);
        std::abort();
    }
    return *current_block;
}

inline unsigned char* dynamic_shared() { return running_block("dynamic shared memory").shared(); }

template <typename T>
T exchange(const Site& site, unsigned int mask, T value, int source) {
    static_assert(std::is_arithmetic<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                  "a warp shuffle moves a 4- or 8-byte number");
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    bits = running_block(site.what).warp_collective(site, mask, bits, source);
    T result;
    std::memcpy(&result, &bits, sizeof result);
    return result;
}

// The calling lane, and the first lane of its segment of `width` lanes (a power of two up to 32).
inline int segment_start(const Site& site, int width) {
    Block& block = running_block(site.what);
    if (width < 1 || width > warpSize || (width & (width - 1)) != 0) {
        block.fail(std::string(site.what) + ": width " + std::to_string(width) + " is not a power of two up to 32");
    }
    return block.running_lane() & ~(width - 1);
}

inline int running_lane(const Site& site) { return running_block(site.what).running_lane(); }

template <typename Body>
void run_body(void* closure) {
    (*static_cast<Body*>(closure))();
}

// Run ``body`` once per thread of a grid of grid[0..2] blocks of block[0..2] threads, each
// block's threads as fibers (see the top of this file) with `shared_bytes` of dynamic shared
// memory. Returns nullptr, or the error of a block that could not finish (the launch stops
// at the first; the message lives until this OS thread's next launch).
template <typename Body>
const char* launch_fibers(const unsigned int* grid, const unsigned int* block, long long shared_bytes, int order,
                          Body body) {
    const long long blocks = (long long)grid[0] * grid[1] * grid[2];
    std::atomic<bool> failed{false};
    std::mutex mutex;
    long long failed_block = blocks;
    std::string failure;
#pragma omp parallel for schedule(dynamic)
    for (long long b = 0; b < blocks; ++b) {
        if (failed.load(std::memory_order_relaxed)) continue;
        set_block(b, grid, block);
        Block emulated(block, shared_bytes, order, run_body<Body>, &body);
        if (!emulated.run()) {
            std::lock_guard<std::mutex> lock(mutex);
            if (b < failed_block) {
                failed_block = b;
                failure = "block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) + ", " +
                          std::to_string(blockIdx.z) + "): " + emulated.error();
            }
            failed = true;
        }
    }
    if (!failed) return nullptr;
    static thread_local std::string report;
    report = failure;
    return report.c_str();
}

}  // namespace oplib_emulation

// ---------------------------------------------------------------------------------------
// The CUDA built-ins of cooperating threads
// ---------------------------------------------------------------------------------------

#define OPLIB_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(oplib_emulation::dynamic_shared())

// The runs of `oplib-cold` blocks (OPLIB_COLD_BLOCK, warp.cuh) in this library since it was
// loaded, one a thread: oplib.testing.cuda_emulation's launcher source exports it, and its
// launcher reads it around each launch.
namespace oplib_emulation {
inline std::atomic<long long> cold_block_runs{0};
}
#define OPLIB_COLD_BLOCK() ((void)oplib_emulation::cold_block_runs.fetch_add(1, std::memory_order_relaxed))

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__syncthreads", file, line};
    oplib_emulation::running_block(site.what).block_barrier(site);
}

inline void __syncwarp(unsigned int mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__syncwarp", file, line};
    oplib_emulation::exchange(site, mask, 0u, oplib_emulation::running_lane(site));
}

// ldmatrix's checks on the host (warp.cuh's oplib_load_matrices): a lane's row address, and
// that its row read when the lane reached the load is the row once every lane has: another
// lane's write in between is a race on the GPU (a __syncwarp missing before the load).
inline void oplib_check_matrix_row(const void* row, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"ldmatrix", file, line};
    oplib_emulation::running_block(site.what).check_matrix_row(row, site);
}

inline void oplib_check_matrix_row_unchanged(bool unchanged, const char* file = __builtin_FILE(),
                                             int line = __builtin_LINE()) {
    if (unchanged) return;
    const oplib_emulation::Site site{"ldmatrix", file, line};
    oplib_emulation::running_block(site.what).matrix_row_raced(site);
}

// The value of lane `source` of the calling lane's segment of `width` lanes.
template <typename T>
T __shfl_sync(unsigned int mask, T value, int source, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__shfl_sync", file, line};
    const int start = oplib_emulation::segment_start(site, width);
    return oplib_emulation::exchange(site, mask, value, start + (source & (width - 1)));
}

// The value of the lane `delta` below in the segment; a lane with none below keeps its own.
template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = warpSize,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__shfl_up_sync", file, line};
    const int start = oplib_emulation::segment_start(site, width);
    const int lane = oplib_emulation::running_lane(site);
    return oplib_emulation::exchange(site, mask, value, delta <= (unsigned int)(lane - start) ? lane - (int)delta : lane);
}

// The value of the lane `delta` above in the segment; a lane with none above keeps its own.
template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = warpSize,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__shfl_down_sync", file, line};
    const int start = oplib_emulation::segment_start(site, width);
    const int lane = oplib_emulation::running_lane(site);
    return oplib_emulation::exchange(site, mask, value,
                                     delta < (unsigned int)(start + width - lane) ? lane + (int)delta : lane);
}

// The value of lane (lane ^ lane_mask); a lane whose partner lies in a later segment (or is
// no lane) keeps its own.
template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = warpSize,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const oplib_emulation::Site site{"__shfl_xor_sync", file, line};
    const int start = oplib_emulation::segment_start(site, width);
    const int lane = oplib_emulation::running_lane(site);
    const int partner = lane ^ lane_mask;
    return oplib_emulation::exchange(site, mask, value, partner < 0 || partner >= start + width ? lane : partner);
}
