// The compiled AXI4-Stream testbench of onnx2fpga.sim.rtl.simulate_rtl (harness="compiled").
//
// Verilator compiles this file together with the design (--cc --exe, --prefix Vdut, so the
// model class is always Vdut whatever the toplevel is called). One run reads a job file
// (argv[1], "key value" lines, written by onnx2fpga/sim/driver.py), the input beats (raw
// little-endian 32-bit words, `in_words` per beat, so any tdata width works), and simulates
// the three phases of simulate_rtl:
//
//   1. correctness: the whole batch with seeded random stalls on both streams;
//   2. latency: one inference with no stalls (when timing_runs > 0);
//   3. interval: timing_runs inferences back to back with no stalls.
//
// Each phase is followed by 16 idle cycles with m_axis_tready high in which no output beat
// may appear. Verilator builds the design inside a wrapper (onnx2fpga_tb, written by
// driver.py) whose registers drive the design's inputs: every cycle the testbench sets the
// wrapper's in_* ports, one rising edge applies them (and ends the design's previous cycle),
// the testbench samples the handshake, and a transfer happens at the next rising edge
// exactly when tvalid and tready were both high in that sample (the cocotb harness does the
// same with the design's own ports; the wrapper adds one cycle in reset before the first). The AXI4-Stream rules are checked on the output stream (tvalid held and
// tdata/tlast stable until the transfer) and tlast must be high on exactly the last beat of
// every tensor.
//
// Stall decisions: std::mt19937_64 seeded with std::seed_seq{seed low 32 bits, seed high
// 32 bits, shard index}; a cycle stalls when (draw >> 11) * 2^-53 < probability. Both
// generator and seeding are fully specified by the C++ standard, so equal jobs give equal
// cycle counts on every platform.
//
// Output files: `outputs` (the output beats of the three phases, in order, `out_words` words
// per beat), `result` ("key value" lines: cycle counts and stamps). A broken stream rule or
// an exceeded cycle budget writes `error` (one message) and exits with status 3.

#include "Vdut.h"
#include "verilated.h"
#if VM_TRACE
#include "verilated_vcd_c.h"
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// ---- Ports of any width: CData/SData/IData (one word), QData (two), VlWide<N> (N). ----

template <class T>
struct PortWords {
    static constexpr std::size_t n = sizeof(T) > 4 ? 2 : 1;
};
template <std::size_t N>
struct PortWords<VlWide<N>> {
    static constexpr std::size_t n = N;
};
template <class T>
constexpr std::size_t port_words(const T&) { return PortWords<std::remove_cv_t<T>>::n; }

template <class T>
inline void put(T& port, const uint32_t* w) {
    if constexpr (sizeof(T) > 4) {
        port = static_cast<T>(w[0]) | (static_cast<T>(w[1]) << 32);
    } else {
        port = static_cast<T>(w[0]);
    }
}
template <std::size_t N>
inline void put(VlWide<N>& port, const uint32_t* w) {
    for (std::size_t i = 0; i < N; ++i) port.at(i) = w[i];
}
template <class T>
inline void get(const T& port, uint32_t* w) {
    w[0] = static_cast<uint32_t>(port);
    if constexpr (sizeof(T) > 4) w[1] = static_cast<uint32_t>(static_cast<uint64_t>(port) >> 32);
}
template <std::size_t N>
inline void get(const VlWide<N>& port, uint32_t* w) {
    for (std::size_t i = 0; i < N; ++i) w[i] = port.at(i);
}

struct StreamError {
    std::string message;
};

std::string hex(const uint32_t* w, std::size_t n) {
    // The word as Python prints it with {:#x}: most significant word first, no leading zeros.
    std::string out;
    char buf[16];
    bool started = false;
    for (std::size_t i = n; i-- > 0;) {
        if (!started) {
            if (w[i] == 0 && i > 0) continue;
            std::snprintf(buf, sizeof buf, "%x", w[i]);
            started = true;
        } else {
            std::snprintf(buf, sizeof buf, "%08x", w[i]);
        }
        out += buf;
    }
    return "0x" + out;
}

class Coins {
  public:
    Coins(std::mt19937_64& rng, double prob) : rng_(rng), prob_(prob) {}
    bool stall() {
        if (prob_ <= 0) return false;
        return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < prob_;
    }

  private:
    std::mt19937_64& rng_;
    double prob_;
};

struct PhaseResult {
    std::vector<uint32_t> words;            // output beats
    std::vector<uint64_t> first_in, last_out;
    uint64_t cycles = 0;
};

constexpr int kDrainCycles = 16;
constexpr int kResetCycles = 4;

class Bench {
  public:
    Bench(std::map<std::string, std::string>& job)
        : ctx_(new VerilatedContext), top_(new Vdut(ctx_.get(), "dut")) {
        in_beats_ = std::stoull(job["in_beats"]);
        out_beats_ = std::stoull(job["out_beats"]);
        in_words_ = std::stoull(job["in_words"]);
        out_words_ = std::stoull(job["out_words"]);
        max_cycles_ = std::stoull(job["max_cycles_per_inference"]);
        progress_seconds_ = std::stod(job["progress_seconds"]);
        tag_ = job["tag"];
        if (in_words_ != port_words(top_->in_s_axis_tdata) ||
            out_words_ != port_words(top_->m_axis_tdata)) {
            throw StreamError{"the job's tdata words per beat do not match the simulator's "
                              "ports (a stale build?)"};
        }
        pending_.resize(out_words_);
        sample_.resize(out_words_);
        start_ = last_report_ = std::chrono::steady_clock::now();
#if VM_TRACE
        if (!job["vcd"].empty()) {
            ctx_->traceEverOn(true);
            trace_ = std::make_unique<VerilatedVcdC>();
            top_->trace(trace_.get(), 99);
            trace_->open(job["vcd"].c_str());
        }
#endif
    }

    ~Bench() {
#if VM_TRACE
        if (trace_) trace_->close();
#endif
        top_->final();
    }

    uint64_t cycle() const { return cycle_; }

    void reset() {
        top_->in_rst = 1;
        top_->in_s_axis_tvalid = 0;
        top_->in_s_axis_tlast = 0;
        const std::vector<uint32_t> zeros(in_words_, 0);
        put(top_->in_s_axis_tdata, zeros.data());
        top_->in_m_axis_tready = 0;
        top_->clk = 0;
        top_->eval();
        idle(kResetCycles);
        top_->in_rst = 0;
        idle(1);
    }

    void drain(const std::string& phase) {
        top_->in_s_axis_tvalid = 0;
        top_->in_m_axis_tready = 1;
        for (int k = 0; k < kDrainCycles; ++k) {
            settle();
            if (top_->m_axis_tvalid) {
                throw StreamError{phase + ": the design sent more than the expected " +
                                  std::to_string(out_beats_) +
                                  " output beats per inference (m_axis_tvalid high " +
                                  std::to_string(cycle_) +
                                  " cycles into the simulation, after the last expected beat)"};
            }
            tick();
        }
        top_->in_m_axis_tready = 0;
    }

    // Stream the tensors whose input beats are `x` (n tensors) through.
    PhaseResult phase(const std::vector<uint32_t>& x, uint64_t n, double stall_in,
                      double stall_out, std::mt19937_64& rng, const std::string& phase,
                      bool report) {
        Coins coins_in(rng, stall_in), coins_out(rng, stall_out);
        const uint64_t n_in = n * in_beats_, n_out = n * out_beats_;
        const double slow = 1.0 / ((1.0 - stall_in) * (1.0 - stall_out));
        const uint64_t budget =
            static_cast<uint64_t>(static_cast<double>(max_cycles_) * n * slow) + 100;
        const uint64_t start_cycle = cycle_;
        uint64_t last_progress = cycle_;
        uint64_t i = 0;
        bool holding = false, has_pending = false;
        uint32_t pending_last = 0;
        PhaseResult res;
        res.words.reserve(n_out * out_words_);
        uint64_t done_out = 0;

        while (done_out < n_out) {
            if (!holding && i < n_in && !coins_in.stall()) {
                put(top_->in_s_axis_tdata, &x[i * in_words_]);
                top_->in_s_axis_tlast = (i % in_beats_ == in_beats_ - 1) ? 1 : 0;
                holding = true;
            }
            top_->in_s_axis_tvalid = holding ? 1 : 0;
            const bool ready = !coins_out.stall();
            top_->in_m_axis_tready = ready ? 1 : 0;

            settle();
            const uint64_t cycle = cycle_;
            if (holding && top_->s_axis_tready) {
                if (i % in_beats_ == 0) res.first_in.push_back(cycle);
                ++i;
                holding = false;
                last_progress = cycle;
            }
            if (top_->m_axis_tvalid) {
                get(top_->m_axis_tdata, sample_.data());
                const uint32_t last = top_->m_axis_tlast ? 1 : 0;
                if (has_pending && (pending_ != sample_ || pending_last != last)) {
                    throw StreamError{
                        phase + ": m_axis_tdata/tlast changed from " +
                        hex(pending_.data(), out_words_) + "/" + std::to_string(pending_last) +
                        " to " + hex(sample_.data(), out_words_) + "/" + std::to_string(last) +
                        " while m_axis_tvalid was high and m_axis_tready low (output beat " +
                        std::to_string(done_out) + ", cycle " + std::to_string(cycle) +
                        "); AXI4-Stream requires them to hold until the transfer"};
                }
                if (ready) {
                    const uint64_t k = done_out;
                    const uint32_t want = (k % out_beats_ == out_beats_ - 1) ? 1 : 0;
                    if (last != want) {
                        throw StreamError{
                            phase + ": m_axis_tlast was " + std::to_string(last) +
                            " on output beat " + std::to_string(k % out_beats_) +
                            " of inference " + std::to_string(k / out_beats_) +
                            "; it must be high on beat " + std::to_string(out_beats_ - 1) +
                            " only (out_port.beats = " + std::to_string(out_beats_) + ")"};
                    }
                    res.words.insert(res.words.end(), sample_.begin(), sample_.end());
                    ++done_out;
                    if (last) {
                        res.last_out.push_back(cycle);
                        if (report && progress_seconds_ > 0) maybe_report(phase, done_out / out_beats_, n);
                    }
                    has_pending = false;
                    last_progress = cycle;
                } else {
                    pending_ = sample_;
                    pending_last = last;
                    has_pending = true;
                }
            } else if (has_pending) {
                throw StreamError{phase + ": m_axis_tvalid fell without a transfer (output beat " +
                                  std::to_string(done_out) + ", cycle " + std::to_string(cycle) +
                                  "); AXI4-Stream requires it to hold until m_axis_tready"};
            }

            if (cycle - last_progress > max_cycles_ || cycle - start_cycle > budget) {
                const std::string why =
                    cycle - last_progress > max_cycles_
                        ? "no transfer for " + std::to_string(max_cycles_) + " cycles"
                        : "the phase exceeded its budget of " + std::to_string(budget) + " cycles";
                throw StreamError{
                    phase + ": simulation stopped at cycle " + std::to_string(cycle) + ", " + why +
                    " (max_cycles_per_inference=" + std::to_string(max_cycles_) +
                    "); the design accepted " + std::to_string(i) + " of " + std::to_string(n_in) +
                    " input beats and sent " + std::to_string(done_out) + " of " +
                    std::to_string(n_out) + " output beats (s_axis_tready=" +
                    std::to_string(top_->s_axis_tready ? 1 : 0) +
                    ", m_axis_tvalid=" + std::to_string(top_->m_axis_tvalid ? 1 : 0) + ")"};
            }
            tick();
        }
        if (i != n_in) {
            throw StreamError{phase + ": the design sent all " + std::to_string(n_out) +
                              " output beats after taking only " + std::to_string(i) + " of " +
                              std::to_string(n_in) + " input beats"};
        }
        top_->in_s_axis_tvalid = 0;
        top_->in_m_axis_tready = 0;
        res.cycles = cycle_ - start_cycle;
        return res;
    }

  private:
    // Inputs set for this cycle (the in_* ports): the rising edge that applies them (the
    // wrapper's registers take them) also ends the design's previous cycle; then the clock
    // falls, and the outputs can be sampled. The design's inputs only change at the edge, so
    // Verilator evaluates its logic once per cycle.
    void settle() {
        top_->clk = 1;
        top_->eval();
#if VM_TRACE
        if (trace_) trace_->dump(cycle_ * 10);
#endif
        top_->clk = 0;
        top_->eval();
#if VM_TRACE
        if (trace_) trace_->dump(cycle_ * 10 + 5);
#endif
    }

    // The end of the cycle: its inputs reach the design at the next settle()'s edge.
    void tick() { ++cycle_; }

    void idle(uint64_t n) {
        for (uint64_t k = 0; k < n; ++k) {
            settle();
            tick();
        }
    }

    void maybe_report(const std::string& phase, uint64_t done, uint64_t n) {
        const auto now = std::chrono::steady_clock::now();
        if (std::chrono::duration<double>(now - last_report_).count() < progress_seconds_) return;
        last_report_ = now;
        const double t = std::chrono::duration<double>(now - start_).count();
        const double left = t * static_cast<double>(n - done) / static_cast<double>(done);
        std::fprintf(stderr,
                     "[rtl] %s%s: %llu/%llu inferences (cycle %llu, %.1f s, %.0f cycles/s, "
                     "about %.0f s left)\n",
                     tag_.c_str(), phase.c_str(), static_cast<unsigned long long>(done),
                     static_cast<unsigned long long>(n), static_cast<unsigned long long>(cycle_),
                     t, static_cast<double>(cycle_) / t, left);
        std::fflush(stderr);
    }

    std::unique_ptr<VerilatedContext> ctx_;
    std::unique_ptr<Vdut> top_;
#if VM_TRACE
    std::unique_ptr<VerilatedVcdC> trace_;
#endif
    uint64_t in_beats_ = 1, out_beats_ = 1, in_words_ = 1, out_words_ = 1, max_cycles_ = 1;
    uint64_t cycle_ = 0;
    double progress_seconds_ = 0;
    std::string tag_;
    std::vector<uint32_t> pending_, sample_;
    std::chrono::steady_clock::time_point start_, last_report_;
};

std::map<std::string, std::string> read_job(const char* path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error(std::string("cannot read job file ") + path);
    std::map<std::string, std::string> job;
    std::string line;
    while (std::getline(f, line)) {
        const auto space = line.find(' ');
        if (space == std::string::npos) {
            job[line] = "";
        } else {
            job[line.substr(0, space)] = line.substr(space + 1);
        }
    }
    return job;
}

std::vector<uint32_t> read_words(const std::string& path, std::size_t count) {
    std::vector<uint32_t> words(count);
    std::ifstream f(path, std::ios::binary);
    if (!f.read(reinterpret_cast<char*>(words.data()),
                static_cast<std::streamsize>(count * sizeof(uint32_t)))) {
        throw std::runtime_error("cannot read " + std::to_string(count) + " words from " + path);
    }
    return words;   // little-endian hosts only (x86-64, AArch64)
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    if (!f) throw std::runtime_error("cannot write " + path);
}

std::string join(const std::vector<uint64_t>& v) {
    std::ostringstream s;
    for (std::size_t k = 0; k < v.size(); ++k) s << (k ? " " : "") << v[k];
    return s.str();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s JOB\n", argv[0]);
        return 2;
    }
    std::map<std::string, std::string> job;
    try {
        job = read_job(argv[1]);
        const uint64_t batch = std::stoull(job["batch"]);
        const uint64_t runs = std::stoull(job["timing_runs"]);
        const uint64_t seed = std::stoull(job["seed"]);
        const uint32_t shard = static_cast<uint32_t>(std::stoul(job["shard"]));
        const uint64_t in_beats = std::stoull(job["in_beats"]);
        const uint64_t in_words = std::stoull(job["in_words"]);
        const uint64_t per_tensor = in_beats * in_words;
        const std::vector<uint32_t> x = read_words(job["input"], batch * per_tensor);

        std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), shard};
        std::mt19937_64 rng(seq);
        Bench bench(job);
        bench.reset();
        const auto start = std::chrono::steady_clock::now();
        PhaseResult stalled = bench.phase(x, batch, std::stod(job["stall_prob_in"]),
                                          std::stod(job["stall_prob_out"]), rng,
                                          "correctness run", true);
        bench.drain("correctness run");
        std::ofstream out(job["outputs"], std::ios::binary);
        auto emit = [&out](const std::vector<uint32_t>& w) {
            out.write(reinterpret_cast<const char*>(w.data()),
                      static_cast<std::streamsize>(w.size() * sizeof(uint32_t)));
        };
        emit(stalled.words);
        std::ostringstream result;
        result << "stalled_cycles " << stalled.cycles << "\n";
        if (runs) {
            std::vector<uint32_t> one(x.begin(), x.begin() + per_tensor);
            PhaseResult lat = bench.phase(one, 1, 0.0, 0.0, rng, "latency run", false);
            bench.drain("latency run");
            std::vector<uint32_t> rows;
            rows.reserve(runs * per_tensor);
            for (uint64_t k = 0; k < runs; ++k) {
                const auto from = x.begin() + (k % batch) * per_tensor;
                rows.insert(rows.end(), from, from + per_tensor);
            }
            PhaseResult ii = bench.phase(rows, runs, 0.0, 0.0, rng, "interval run", false);
            bench.drain("interval run");
            emit(lat.words);
            emit(ii.words);
            result << "latency_cycles " << lat.last_out[0] - lat.first_in[0] << "\n";
            result << "tlast_cycles " << join(ii.last_out) << "\n";
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        result << "total_cycles " << bench.cycle() << "\n";
        result << "sim_seconds " << seconds << "\n";
        out.close();
        if (!out) throw std::runtime_error("cannot write " + job["outputs"]);
        write_text(job["result"], result.str());
    } catch (const StreamError& e) {
        try {
            write_text(job["error"], e.message + "\n");
        } catch (...) {
        }
        return 3;
    } catch (const std::exception& e) {
        // To stdout, which goes to sim.log (stderr may be the user's terminal, for progress);
        // the caller quotes the log's last lines.
        std::printf("axis_driver: %s\n", e.what());
        return 2;
    }
    return 0;
}
