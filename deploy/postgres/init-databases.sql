-- Run once by the postgres:16 image on an empty data volume (/docker-entrypoint-initdb.d/).
-- One database per greenserve service, all owned by the POSTGRES_USER (greenserve); each
-- service keeps its tables in its own database.
CREATE DATABASE greenserve_forecaster OWNER greenserve;
CREATE DATABASE greenserve_profiler OWNER greenserve;
CREATE DATABASE greenserve_optimizer OWNER greenserve;
CREATE DATABASE greenserve_cache_manager OWNER greenserve;
CREATE DATABASE greenserve_gpu_partitioner OWNER greenserve;
CREATE DATABASE greenserve_router OWNER greenserve;
