// TensorBoard event files (train/tensorboard.h) read back by a decoder of
// their own, written here from TensorFlow's format and not from ztrain's
// proto file: the TFRecord framing (length, masked CRC-32C of the length,
// the record, its masked CRC-32C, checked with the plain bytewise CRC), and
// the Event fields by TensorFlow's numbers (wall_time 1 fixed64, step 2
// varint, file_version 3, summary 5; Summary.value 1; Value.tag 1,
// simple_value 2 fixed32).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "io/crc32c.h"
#include "support.h"
#include "train/tensorboard.h"
#include "ztrain/error.h"

using namespace ztrain;

namespace {

struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> values;
};

// Protobuf's wire format, the four kinds used.
struct Reader {
  const unsigned char* p;
  const unsigned char* end;
  bool done() const { return p >= end; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; p < end; shift += 7) {
      const unsigned char b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    FAIL("a varint runs past its message");
    return 0;
  }
  template <class T>
  T fixed() {
    REQUIRE(end - p >= static_cast<std::ptrdiff_t>(sizeof(T)));
    T v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  Reader nested() {
    const auto n = static_cast<std::ptrdiff_t>(varint());
    REQUIRE(end - p >= n);
    Reader r{p, p + n};
    p += n;
    return r;
  }
  std::string string() {
    Reader r = nested();
    return {reinterpret_cast<const char*>(r.p), reinterpret_cast<const char*>(r.end)};
  }
};

std::uint32_t masked(const void* data, std::size_t n) {
  const std::uint32_t crc = crc32c_reference(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// A value whose simple_value is absent is one TensorBoard skips: it is not
// recorded (so a 0 must be written, not left to proto3's default).
void read_value(Reader r, Event& e) {
  std::string tag;
  std::optional<float> value;
  while (!r.done()) {
    const std::uint64_t key = r.varint();
    if (key == (1 << 3 | 2))
      tag = r.string();
    else if (key == (2 << 3 | 5))
      value = r.fixed<float>();
    else
      FAIL("unexpected Summary.Value field " << key);
  }
  if (value) e.values[tag] = *value;
}

Event decode(Reader r) {
  Event e;
  while (!r.done()) {
    const std::uint64_t key = r.varint();
    if (key == (1 << 3 | 1)) {
      e.wall_time = r.fixed<double>();
    } else if (key == (2 << 3 | 0)) {
      e.step = static_cast<std::int64_t>(r.varint());
    } else if (key == (3 << 3 | 2)) {
      e.file_version = r.string();
    } else if (key == (5 << 3 | 2)) {
      Reader summary = r.nested();
      while (!summary.done()) {
        REQUIRE(summary.varint() == (1 << 3 | 2));
        read_value(summary.nested(), e);
      }
    } else {
      FAIL("unexpected Event field " << key);
    }
  }
  return e;
}

std::vector<Event> read_events(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<Event> events;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    std::uint64_t len = 0;
    std::uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    CHECK(len_crc == masked(bytes.data() + at, 8));
    REQUIRE(bytes.size() - at - 12 >= len + 4);
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.data() + at + 12);
    std::memcpy(&data_crc, data + len, 4);
    CHECK(data_crc == masked(data, len));
    events.push_back(decode(Reader{data, data + len}));
    at += 12 + len + 4;
  }
  return events;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("tensorboard: framing, checksums, the version record and every scalar") {
  test::TempDir dir;
  const double before = now_s();
  std::filesystem::path path;
  {
    TensorBoardFile tb(dir / "tb");
    path = tb.path();
    tb.scalars(1, {{"train/loss", 5.25}, {"train/lr", 3e-4}, {"comm/bytes_sent", 0.0}});
    tb.scalars(10, {{"val/loss", 4.5}});
    tb.scalars(1LL << 40, {{"train/tokens_per_s", 123456.0}});
  }
  const double after = now_s();
  CHECK(path.filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::vector<Event> events = read_events(path);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[1].step == 1);
  CHECK(events[1].values == std::map<std::string, float>{{"train/loss", 5.25f},
                                                         {"train/lr", 3e-4f},
                                                         {"comm/bytes_sent", 0}});
  CHECK(events[2].step == 10);
  CHECK(events[2].values.at("val/loss") == 4.5f);
  CHECK(events[3].step == 1LL << 40);
  CHECK(events[3].values.at("train/tokens_per_s") == 123456.0f);
  for (const Event& e : events) {
    CHECK(e.wall_time >= before - 1);
    CHECK(e.wall_time <= after + 1);
  }
  // Every record is on disk as soon as it is written: a second file in the
  // same directory (a resumed run) leaves the first whole.
  TensorBoardFile again(dir / "tb");
  CHECK(again.path() != path);
  CHECK(read_events(path).size() == 4);
  CHECK(read_events(again.path()).size() == 1);
}

TEST_CASE("tensorboard: a directory that cannot be made is an error naming it") {
  test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  CHECK(test::message_of<Error>([&] {
          TensorBoardFile tb(dir / "file" / "tb");
        }).find("cannot make the TensorBoard directory '" + (dir / "file" / "tb").string()) !=
        std::string::npos);
}
