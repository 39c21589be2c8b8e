// validate's report.html in a real browser (Debian's chromium, headless): no console messages,
// every SVG chart present with drawn shapes of non-zero size after layout, and a screenshot whose
// pixels are not blank and show the charts' colours. Tagged [.browser]: hidden from the default
// run; ctest runs it as `validate_report_in_browser`, which is SKIPPED (exit 77) where chromium is
// not installed. Run directly without chromium, it fails rather than pass silently.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "validate_fixtures.hpp"

using namespace stepcast;
using namespace stepcast::test;
using Catch::Contains;

namespace {

namespace fs = std::filesystem;

CommandResult shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  CommandResult r;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.output.append(buffer.data(), n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An 8-bit RGB or RGBA PNG, decoded: IHDR, the IDAT stream inflated, scanline filters undone.
struct Image {
  uint32_t width = 0;
  uint32_t height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // row-major, `channels` bytes per pixel
  uint32_t rgb(size_t x, size_t y) const {
    const uint8_t* p = &pixels[(y * width + x) * size_t(channels)];
    return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
  }
};

uint32_t big_endian(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

Image decode_png(const std::string& file) {
  std::string data = read_file(file);
  REQUIRE(data.size() > 8);
  REQUIRE(data.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  Image image;
  std::string idat;
  for (size_t at = 8; at + 8 <= data.size();) {
    uint32_t length = big_endian(data, at);
    std::string type = data.substr(at + 4, 4);
    REQUIRE(at + 12 + length <= data.size());
    if (type == "IHDR") {
      image.width = big_endian(data, at + 8);
      image.height = big_endian(data, at + 12);
      int bit_depth = uint8_t(data[at + 16]), color_type = uint8_t(data[at + 17]);
      int interlace = uint8_t(data[at + 20]);
      REQUIRE(bit_depth == 8);
      REQUIRE((color_type == 2 || color_type == 6));
      REQUIRE(interlace == 0);
      image.channels = color_type == 6 ? 4 : 3;
    } else if (type == "IDAT") {
      idat += data.substr(at + 8, length);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + length;
  }
  REQUIRE(image.channels > 0);
  size_t stride = size_t(image.width) * size_t(image.channels);
  std::vector<uint8_t> raw((stride + 1) * image.height);
  uLongf raw_size = raw.size();
  REQUIRE(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()),
                     uLong(idat.size())) == Z_OK);
  REQUIRE(raw_size == raw.size());
  image.pixels.resize(stride * image.height);
  int bpp = image.channels;
  for (size_t y = 0; y < image.height; ++y) {
    uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &image.pixels[y * stride];
    const uint8_t* up = y > 0 ? &image.pixels[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      int a = i >= size_t(bpp) ? out[i - size_t(bpp)] : 0;
      int b = up ? up[i] : 0;
      int c = up && i >= size_t(bpp) ? up[i - size_t(bpp)] : 0;
      int predictor = 0;
      switch (filter) {
        case 0: predictor = 0; break;
        case 1: predictor = a; break;
        case 2: predictor = b; break;
        case 3: predictor = (a + b) / 2; break;
        case 4: {
          int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: FAIL("PNG filter type " << int(filter));
      }
      out[i] = uint8_t(in[i] + predictor);
    }
  }
  return image;
}

std::string find_chromium() {
  CommandResult r = shell("command -v chromium || command -v chromium-browser");
  std::string path = r.output.substr(0, r.output.find('\n'));
  return r.exit_code == 0 ? path : "";
}

// Appended to the report under test: after layout, each <svg> and its drawn shapes' sizes, as
// text in the DOM that --dump-dom prints ("svg W H SHAPES_WITH_AREA" per chart).
const char* const kSvgProbe = R"(<script>
(function () {
  var lines = [];
  document.querySelectorAll('svg').forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    var drawn = 0;
    svg.querySelectorAll('rect, circle, path, line, polygon, polyline').forEach(function (s) {
      var b = s.getBBox();
      if (b.width > 0 || b.height > 0) drawn++;
    });
    lines.push('svg ' + Math.round(box.width) + ' ' + Math.round(box.height) + ' ' + drawn);
  });
  var pre = document.createElement('pre');
  pre.id = 'svg-probe';
  pre.textContent = lines.join('\n');
  document.body.appendChild(pre);
})();
</script>)";

}  // namespace

TEST_CASE("validate: report.html renders in headless chromium", "[.browser]") {
  std::string chromium = find_chromium();
  if (chromium.empty()) {
    FAIL("chromium is not installed (bash scripts/install-deps.sh installs it); ctest skips this "
         "test where it is missing");
  }
  fs::path dir = fs::temp_directory_path() / ("stepcast-browser-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ostringstream page;
  write_validate_html(page, synthetic_report());
  std::string html = page.str();
  std::string report = (dir / "report.html").string();
  std::ofstream(report) << html;
  std::string probed = html;
  probed.insert(probed.rfind("</body>"), kSvgProbe);
  std::string probe = (dir / "probe.html").string();
  std::ofstream(probe) << probed;

  std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" +
                      (dir / "profile").string();
  // The DOM after scripts and layout, with the page's console on stderr.
  CommandResult dom = shell("timeout 120 " + chromium + flags +
                            " --enable-logging=stderr --v=0 --dump-dom file://" + probe + " 2>" +
                            (dir / "console.txt").string());
  INFO(dom.output.substr(0, 2000));
  REQUIRE(dom.exit_code == 0);
  std::string console = read_file((dir / "console.txt").string());
  std::vector<std::string> console_lines;
  std::istringstream lines(console);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos) {
      console_lines.push_back(line);
    }
  }
  INFO("console: " << console);
  CHECK(console_lines.empty());

  std::smatch match;
  REQUIRE(std::regex_search(dom.output, match, std::regex("<pre id=\"svg-probe\">([^<]*)</pre>")));
  std::string probe_text = match[1].str();
  INFO("probe: " << probe_text);
  std::regex svg_line("svg (\\d+) (\\d+) (\\d+)");
  int charts = 0;
  for (std::sregex_iterator it(probe_text.begin(), probe_text.end(), svg_line), end; it != end; ++it) {
    ++charts;
    CHECK(std::stoi((*it)[1]) > 100);  // laid out with a size
    CHECK(std::stoi((*it)[2]) > 100);
    CHECK(std::stoi((*it)[3]) > 5);    // and shapes drawn in it
  }
  CHECK(charts == 5);

  // The screenshot of the report as it is (no probe), the page's top 1280 × 3000 pixels.
  std::string png = (dir / "report.png").string();
  CommandResult shot = shell("timeout 120 " + chromium + flags + " --screenshot=" + png +
                             " --window-size=1280,3000 file://" + report + " 2>&1");
  INFO(shot.output);
  REQUIRE(shot.exit_code == 0);
  REQUIRE(fs::exists(png));
  CHECK(fs::file_size(png) > 20000);
  Image image = decode_png(png);
  CHECK(image.width == 1280);
  CHECK(image.height == 3000);
  std::map<uint32_t, size_t> colours;
  for (size_t y = 0; y < image.height; y += 2) {
    for (size_t x = 0; x < image.width; x += 2) ++colours[image.rgb(x, y)];
  }
  size_t sampled = (image.height / 2) * (image.width / 2);
  size_t background = 0;
  for (const auto& [rgb, n] : colours) background = std::max(background, n);
  INFO(colours.size() << " colours; the commonest covers " << background << " of " << sampled);
  CHECK(colours.size() > 50);                  // text, axes, bars: not a blank page
  CHECK(double(background) < 0.97 * double(sampled));
  // The charts' first two series colours (compute / predicted, exposed comm / measured).
  CHECK(colours[0x4e79a7] > 100);
  CHECK(colours[0xf28e2b] > 100);
  fs::remove_all(dir);
}
