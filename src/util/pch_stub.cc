// Compiled only to produce the executables' shared precompiled header.
