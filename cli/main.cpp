#include <cstdio>
int main() { std::puts("duet: under construction"); return 0; }
