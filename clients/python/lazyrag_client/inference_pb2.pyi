from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ATTENTION_MODE_FULL: AttentionMode
ATTENTION_MODE_LAZY: AttentionMode
ATTENTION_MODE_MATERIALIZE: AttentionMode
ATTENTION_MODE_PREFIX: AttentionMode
DESCRIPTOR: _descriptor.FileDescriptor
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_UNSPECIFIED: FinishReason

class Document(_message.Message):
    __slots__ = ["id", "text"]
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    def __init__(self, text: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class FloatSetting(_message.Message):
    __slots__ = ["value"]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ["cache_namespace", "documents", "ignore_eos", "max_tokens", "mode", "quality", "query", "request_id", "sampling", "stop", "system_prompt"]
    CACHE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    cache_namespace: str
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    ignore_eos: bool
    max_tokens: int
    mode: AttentionMode
    quality: QualityOptions
    query: str
    request_id: str
    sampling: SamplingParams
    stop: _containers.RepeatedScalarFieldContainer[str]
    system_prompt: str
    def __init__(self, request_id: _Optional[str] = ..., system_prompt: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., query: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: bool = ..., mode: _Optional[_Union[AttentionMode, str]] = ..., cache_namespace: _Optional[str] = ..., quality: _Optional[_Union[QualityOptions, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ["document_ids", "finish_reason", "request_id", "text", "timings", "token_ids", "usage"]
    DOCUMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    document_ids: _containers.RepeatedScalarFieldContainer[str]
    finish_reason: FinishReason
    request_id: str
    text: str
    timings: Timings
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    usage: Usage
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., document_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HostCacheStats(_message.Message):
    __slots__ = ["capacity_bytes", "entries", "used_bytes"]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    capacity_bytes: int
    entries: int
    used_bytes: int
    def __init__(self, capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., entries: _Optional[int] = ...) -> None: ...

class IntSetting(_message.Message):
    __slots__ = ["value"]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ["page_size", "pages_free", "pages_pinned", "pages_total", "pages_used"]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    PAGES_PINNED_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_USED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    pages_free: int
    pages_pinned: int
    pages_total: int
    pages_used: int
    def __init__(self, page_size: _Optional[int] = ..., pages_total: _Optional[int] = ..., pages_free: _Optional[int] = ..., pages_used: _Optional[int] = ..., pages_pinned: _Optional[int] = ...) -> None: ...

class PrepareDocumentsRequest(_message.Message):
    __slots__ = ["cache_namespace", "texts"]
    CACHE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    cache_namespace: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., cache_namespace: _Optional[str] = ...) -> None: ...

class PrepareDocumentsResponse(_message.Message):
    __slots__ = ["documents"]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[PreparedDocument]
    def __init__(self, documents: _Optional[_Iterable[_Union[PreparedDocument, _Mapping]]] = ...) -> None: ...

class PreparedDocument(_message.Message):
    __slots__ = ["computed", "id", "num_tokens"]
    COMPUTED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    computed: bool
    id: str
    num_tokens: int
    def __init__(self, id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., computed: bool = ...) -> None: ...

class QualityOptions(_message.Message):
    __slots__ = ["document_scale", "document_temperature", "drop_first_tokens", "recompute_first_tokens"]
    DOCUMENT_SCALE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    DROP_FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    document_scale: FloatSetting
    document_temperature: FloatSetting
    drop_first_tokens: IntSetting
    recompute_first_tokens: IntSetting
    def __init__(self, recompute_first_tokens: _Optional[_Union[IntSetting, _Mapping]] = ..., document_temperature: _Optional[_Union[FloatSetting, _Mapping]] = ..., document_scale: _Optional[_Union[FloatSetting, _Mapping]] = ..., drop_first_tokens: _Optional[_Union[IntSetting, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ["seed", "temperature", "top_k", "top_p"]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    seed: int
    temperature: float
    top_k: int
    top_p: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ["for_tenant"]
    FOR_TENANT_FIELD_NUMBER: _ClassVar[int]
    for_tenant: str
    def __init__(self, for_tenant: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ["host_cache", "model", "model_fingerprint", "pool", "resident_document_ids", "running_requests", "waiting_requests"]
    HOST_CACHE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_DOCUMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    host_cache: HostCacheStats
    model: str
    model_fingerprint: str
    pool: PoolStats
    resident_document_ids: _containers.RepeatedScalarFieldContainer[str]
    running_requests: int
    waiting_requests: int
    def __init__(self, resident_document_ids: _Optional[_Iterable[str]] = ..., pool: _Optional[_Union[PoolStats, _Mapping]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., model: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., host_cache: _Optional[_Union[HostCacheStats, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ["queue_ms", "total_ms", "ttft_ms"]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    total_ms: float
    ttft_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ["cached_document_tokens", "completion_tokens", "computed_tokens", "document_scale", "document_temperature", "document_tokens", "drop_first_tokens", "host_document_tokens", "pool_document_tokens", "prompt_tokens", "recompute_first_tokens", "recomputed_document_tokens", "store_document_tokens"]
    CACHED_DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_SCALE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROP_FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOST_DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POOL_DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STORE_DOCUMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cached_document_tokens: int
    completion_tokens: int
    computed_tokens: int
    document_scale: float
    document_temperature: float
    document_tokens: int
    drop_first_tokens: int
    host_document_tokens: int
    pool_document_tokens: int
    prompt_tokens: int
    recompute_first_tokens: int
    recomputed_document_tokens: int
    store_document_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., document_tokens: _Optional[int] = ..., cached_document_tokens: _Optional[int] = ..., pool_document_tokens: _Optional[int] = ..., store_document_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., host_document_tokens: _Optional[int] = ..., recompute_first_tokens: _Optional[int] = ..., recomputed_document_tokens: _Optional[int] = ..., document_temperature: _Optional[float] = ..., document_scale: _Optional[float] = ..., drop_first_tokens: _Optional[int] = ...) -> None: ...

class AttentionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
