// core/json_io.h: JSON text and files that come out whatever bytes a model produced.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/json_io.h"
#include "test_util.h"

namespace lychee {
namespace {

// A token can end inside a UTF-8 character: "\xD7" is the first byte of a two-byte one. Plain
// dump() throws on it (it did at the end of a 480-sample eval, losing the run); dump_json puts
// U+FFFD in its place and keeps the rest.
TEST(JsonIo, InvalidUtf8BecomesTheReplacementCharacter) {
  const nlohmann::json j = {{"answer", std::string("ab\xD7")}, {"n", 3}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  EXPECT_EQ(dump_json(j), "{\"answer\":\"ab\xEF\xBF\xBD\",\"n\":3}");
  EXPECT_EQ(dump_json(nlohmann::json("caf\xC3\xA9")), "\"caf\xC3\xA9\"");  // valid UTF-8 stays as it is
}

TEST(JsonIo, WritesTheFileAndNamesAPathItCannotWrite) {
  const std::string path = ::testing::TempDir() + "/json_io_test.json";
  write_json_file(path, nlohmann::json{{"text", std::string("x\xE2\x82")}}, 1);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text.str())["text"], "x\xEF\xBF\xBD");
  std::remove(path.c_str());
  test::expect_error([] { write_json_file("/nonexistent-dir/out.json", nlohmann::json::object()); },
                     ErrorCode::kNotFound, "/nonexistent-dir/out.json");
}

}  // namespace
}  // namespace lychee
