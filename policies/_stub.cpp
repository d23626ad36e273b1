// Temporary stub so the library has a source while the module is written.
