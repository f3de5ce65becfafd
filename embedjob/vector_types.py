"""pgvector's column types for the vectors table's `embedding`, by `spec.sink.vectorType`."""

from sqlalchemy.types import UserDefinedType


class Vector(UserDefinedType):
    """pgvector's `vector(n)`; values travel as pgvector's text form '[1,2,3]'."""

    cache_ok = True

    def __init__(self, dim: int):
        self.dim = dim

    def get_col_spec(self, **kw) -> str:
        return f"vector({self.dim})"


class HalfVector(Vector):
    """pgvector's `halfvec(n)`: 16-bit floats, half the bytes of `vector(n)`."""

    def get_col_spec(self, **kw) -> str:
        return f"halfvec({self.dim})"


# spec.sink.vectorType -> the column type of the vectors table's `embedding`.
VECTOR_TYPES = {"vector": Vector, "halfvec": HalfVector}
