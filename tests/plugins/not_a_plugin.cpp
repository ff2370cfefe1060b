// A shared library without the ztrain section.
extern "C" int not_a_plugin_answer() {
  return 42;
}
