// Helpers of the platform tests (tests/sim/test_platform.cpp, test_fabric_kinds.cpp): each
// simulation in a forked child, routes as link names, flows started together, a ring all-reduce
// expanded step by step. Times in simulated seconds.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <simgrid/s4u.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "json_input.hpp"
#include "platform.hpp"

namespace stepcast::test {

// Runs `produce` in a forked child and returns the JSON it produced: SimGrid allows one simulation
// per process (a second engine continues the first one's clock). Fails the test when the child
// does not finish cleanly.
inline Json json_from_child(const std::function<Json()>& produce) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    int exit_code = 0;
    try {
      std::string text = produce().dump();
      for (size_t done = 0; done < text.size();) {
        ssize_t n = write(fds[1], text.data() + done, text.size() - done);
        if (n <= 0) throw std::runtime_error("write to the test process failed");
        done += size_t(n);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "simulation failed: %s\n", e.what());
      exit_code = 1;
    }
    close(fds[1]);
    _exit(exit_code);
  }
  close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, size_t(n));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return Json::parse(text);
}

// Runs `simulate` in a child process on a fresh, configured engine without a platform and returns
// the JSON it produced.
inline Json simulate_in_child(const std::function<Json(simgrid::s4u::Engine&)>& simulate) {
  return json_from_child([&] {
    int argc = 1;
    char name[] = "stepcast_tests";
    char* argv[] = {name, nullptr};
    auto* engine = new simgrid::s4u::Engine(&argc, argv);  // the child ends with _exit: no teardown
    configure_engine(*engine);
    return simulate(*engine);
  });
}

inline std::vector<int64_t> device_range(int64_t first, int64_t count) {
  std::vector<int64_t> devices(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) devices[size_t(i)] = first + i;
  return devices;
}

// The links (by name) and latency of the route from `src` to `dst`.
inline Json route_of(const Platform& platform, int64_t src, int64_t dst) {
  std::vector<simgrid::s4u::Link*> links;
  double latency_s = 0;
  platform.host_of_device.at(src)->route_to(platform.host_of_device.at(dst), links, &latency_s);
  Json names = Json::array();
  for (const simgrid::s4u::Link* link : links) names.push_back(link->get_name());
  return {{"links", names}, {"latency_s", latency_s}};
}

// True when some link of `route` has `part` in its name.
inline bool crosses(const Json& route, const std::string& part) {
  for (const auto& name : route.at("links"))
    if (name.get<std::string>().find(part) != std::string::npos) return true;
  return false;
}

inline bool crosses_link(const Json& route, const std::string& name) {
  for (const auto& link : route.at("links"))
    if (link.get<std::string>() == name) return true;
  return false;
}

struct Flow {
  int64_t src = 0;
  int64_t dst = 0;
  uint64_t bytes = 0;
};

// Starts every flow at time 0 and returns the simulated time at which each one ends.
inline std::vector<double> time_flows(simgrid::s4u::Engine& engine, const Platform& platform,
                                      const std::vector<Flow>& flows) {
  std::vector<double> end_s(flows.size(), -1);
  for (size_t i = 0; i < flows.size(); ++i) {
    simgrid::s4u::Host* src = platform.host_of_device.at(flows[i].src);
    simgrid::s4u::Host* dst = platform.host_of_device.at(flows[i].dst);
    simgrid::s4u::Actor::create("flow" + std::to_string(i), src, [src, dst, &flows, &end_s, i] {
      simgrid::s4u::Comm::sendto(src, dst, flows[i].bytes);
      end_s[i] = simgrid::s4u::Engine::get_clock();
    });
  }
  engine.run();
  return end_s;
}

// Ring all-reduce expanded step by step: 2(n−1) steps, in each rank r sends bytes/n to rank r+1
// and waits for its own receive from rank r−1. Adds the ranks' actors (mailboxes named after
// `ring`, so that several rings may run at once); `last_end_s` gets the time the last one ends.
inline void add_ring_all_reduce(const std::vector<simgrid::s4u::Host*>& ranks, uint64_t bytes, const std::string& ring,
                                double& last_end_s) {
  const size_t n = ranks.size();
  const uint64_t chunk_bytes = bytes / n;
  static int payload = 0;  // mailboxes carry a pointer; nothing is read from it
  for (size_t r = 0; r < n; ++r) {
    simgrid::s4u::Actor::create(ring + "-rank" + std::to_string(r), ranks[r], [r, n, chunk_bytes, ring, &last_end_s] {
      simgrid::s4u::Mailbox* inbox = simgrid::s4u::Mailbox::by_name(ring + std::to_string(r));
      simgrid::s4u::Mailbox* next = simgrid::s4u::Mailbox::by_name(ring + std::to_string((r + 1) % n));
      for (size_t step = 0; step < 2 * (n - 1); ++step) {
        simgrid::s4u::CommPtr send = next->put_async(&payload, chunk_bytes);
        inbox->get<int>();
        send->wait();
      }
      last_end_s = std::max(last_end_s, simgrid::s4u::Engine::get_clock());
    });
  }
}

// One ring all-reduce over `ranks`; returns when the last rank finishes.
inline double time_ring_all_reduce(simgrid::s4u::Engine& engine, const std::vector<simgrid::s4u::Host*>& ranks,
                                   uint64_t bytes) {
  double last_end_s = 0;
  add_ring_all_reduce(ranks, bytes, "ring", last_end_s);
  engine.run();
  return last_end_s;
}

}  // namespace stepcast::test
