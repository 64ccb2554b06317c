"""forge_cpu_simd: the NumPy backend plugin of forge (always available; the fallback)."""
