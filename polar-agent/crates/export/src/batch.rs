//! Rows to Arrow and back: [`record_batch`] turns one trajectory into a
//! [`RecordBatch`] of the export schema (one row per trace), and
//! [`batch_rows`] reads such a batch back into [`Row`]s. JSON columns are
//! serialized once per trajectory where they repeat.

use std::borrow::Cow;
use std::sync::Arc;

use arrow_array::builder::{
    Float32Builder, Float64Builder, ListBuilder, StringBuilder, UInt8Builder, UInt32Builder,
};
use arrow_array::types::ArrowPrimitiveType;
use arrow_array::{
    Array, ArrayRef, Float64Array, ListArray, PrimitiveArray, RecordBatch, StringArray, UInt32Array,
};
use arrow_schema::DataType;
use serde::Serialize;

use polar_trajectory::Trajectory;

use super::error::ExportError;
use super::row::{
    Row, TraceExtras, break_reason_name, chain_role_name, label_name, parse_name, rows, status_name,
};
use super::schema::{EXPORT_SCHEMA_VERSION, arrow_schema, item_field};

/// Appends `value` as JSON text.
fn append_json<T: Serialize + ?Sized>(
    b: &mut StringBuilder,
    scratch: &mut Vec<u8>,
    value: &T,
) -> Result<(), ExportError> {
    scratch.clear();
    serde_json::to_writer(&mut *scratch, value)?;
    let text = std::str::from_utf8(scratch).map_err(|e| ExportError::Schema {
        version: EXPORT_SCHEMA_VERSION,
        detail: format!("JSON encoder produced invalid UTF-8: {e}"),
    })?;
    b.append_value(text);
    Ok(())
}

fn list<T: arrow_array::builder::ArrayBuilder>(
    values: T,
    dt: DataType,
    rows: usize,
) -> ListBuilder<T> {
    ListBuilder::with_capacity(values, rows).with_field(item_field(dt))
}

/// The record batch of `traj`: one row per trace.
pub fn record_batch(traj: &Trajectory) -> Result<RecordBatch, ExportError> {
    let mut b = ColumnBuilders::for_trajectory(traj);
    let mut scratch = Vec::new();
    let traj_md_json = serde_json::to_string(&traj.metadata)?;
    let stats_json = serde_json::to_string(&traj.stats)?;
    for row in rows(traj) {
        b.append(&row, &mut scratch)?;
        b.trajectory_metadata.append_value(&traj_md_json);
        b.stats.append_value(&stats_json);
    }
    Ok(RecordBatch::try_new(arrow_schema(), b.finish())?)
}

/// One builder per export column, in schema order.
struct ColumnBuilders {
    schema_version: UInt32Builder,
    trace_id: StringBuilder,
    session_id: StringBuilder,
    task_id: StringBuilder,
    group_id: StringBuilder,
    attempt: UInt32Builder,
    policy_version: StringBuilder,
    weight_version: StringBuilder,
    status: StringBuilder,
    error: StringBuilder,
    builder: StringBuilder,
    trace_index: UInt32Builder,
    chain: UInt32Builder,
    chain_role: StringBuilder,
    segment: UInt32Builder,
    segment_kind: StringBuilder,
    break_reason: StringBuilder,
    labels: ListBuilder<StringBuilder>,
    finish_reason: StringBuilder,
    reward: Float64Builder,
    prompt_ids: ListBuilder<UInt32Builder>,
    response_ids: ListBuilder<UInt32Builder>,
    loss_mask: ListBuilder<UInt8Builder>,
    logprobs: ListBuilder<Float32Builder>,
    prompt_messages: StringBuilder,
    response_messages: StringBuilder,
    tools: StringBuilder,
    call_ids: ListBuilder<StringBuilder>,
    trace_metadata: StringBuilder,
    trajectory_metadata: StringBuilder,
    stats: StringBuilder,
    off_policy_context_tokens: UInt32Builder,
}

impl ColumnBuilders {
    /// Builders sized for `traj`'s traces and tokens.
    fn for_trajectory(traj: &Trajectory) -> Self {
        let n = traj.traces.len();
        let prompt_tokens: usize = traj.traces.iter().map(|t| t.prompt_ids.len()).sum();
        let response_tokens: usize = traj.traces.iter().map(|t| t.response_ids.len()).sum();
        let strings = || StringBuilder::with_capacity(n, 16 * n);
        Self {
            schema_version: UInt32Builder::with_capacity(n),
            trace_id: strings(),
            session_id: strings(),
            task_id: strings(),
            group_id: strings(),
            attempt: UInt32Builder::with_capacity(n),
            policy_version: strings(),
            weight_version: strings(),
            status: strings(),
            error: strings(),
            builder: strings(),
            trace_index: UInt32Builder::with_capacity(n),
            chain: UInt32Builder::with_capacity(n),
            chain_role: strings(),
            segment: UInt32Builder::with_capacity(n),
            segment_kind: strings(),
            break_reason: strings(),
            labels: list(strings(), DataType::Utf8, n),
            finish_reason: strings(),
            reward: Float64Builder::with_capacity(n),
            prompt_ids: list(
                UInt32Builder::with_capacity(prompt_tokens),
                DataType::UInt32,
                n,
            ),
            response_ids: list(
                UInt32Builder::with_capacity(response_tokens),
                DataType::UInt32,
                n,
            ),
            loss_mask: list(
                UInt8Builder::with_capacity(response_tokens),
                DataType::UInt8,
                n,
            ),
            logprobs: list(
                Float32Builder::with_capacity(response_tokens),
                DataType::Float32,
                n,
            ),
            prompt_messages: strings(),
            response_messages: strings(),
            tools: strings(),
            call_ids: list(strings(), DataType::Utf8, n),
            trace_metadata: strings(),
            trajectory_metadata: strings(),
            stats: strings(),
            off_policy_context_tokens: UInt32Builder::with_capacity(n),
        }
    }

    /// Appends `row` to every column but `trajectory_metadata` and `stats`
    /// (the same for every row: the caller serializes them once).
    fn append(&mut self, row: &Row<'_>, scratch: &mut Vec<u8>) -> Result<(), ExportError> {
        self.schema_version.append_value(row.schema_version);
        self.trace_id.append_value(&row.trace_id);
        self.session_id.append_value(&row.session_id);
        self.task_id.append_option(row.task_id.as_deref());
        self.group_id.append_option(row.group_id.as_deref());
        self.attempt.append_option(row.attempt);
        self.policy_version
            .append_option(row.policy_version.as_deref());
        self.weight_version
            .append_option(row.weight_version.as_deref());
        self.status.append_value(status_name(row.status));
        self.error.append_option(row.error.as_deref());
        self.builder.append_value(&row.builder);
        self.trace_index.append_value(row.trace_index);
        self.chain.append_value(row.chain);
        self.off_policy_context_tokens
            .append_option(row.off_policy_context_tokens);
        self.chain_role
            .append_value(chain_role_name(row.chain_role));
        self.segment.append_value(row.segment);
        self.segment_kind.append_value(&row.segment_kind);
        self.break_reason
            .append_option(row.break_reason.map(break_reason_name));
        for l in row.labels.iter() {
            self.labels.values().append_value(label_name(*l));
        }
        self.labels.append(true);
        self.finish_reason
            .append_option(row.finish_reason.as_deref());
        self.reward.append_option(row.reward);
        self.prompt_ids.values().append_slice(&row.prompt_ids);
        self.prompt_ids.append(true);
        self.response_ids.values().append_slice(&row.response_ids);
        self.response_ids.append(true);
        self.loss_mask.values().append_slice(&row.loss_mask);
        self.loss_mask.append(true);
        match &row.response_logprobs {
            Some(l) => {
                self.logprobs.values().append_slice(l);
                self.logprobs.append(true);
            }
            None => self.logprobs.append(false),
        }
        append_json(&mut self.prompt_messages, scratch, &*row.prompt_messages)?;
        append_json(
            &mut self.response_messages,
            scratch,
            &*row.response_messages,
        )?;
        append_json(&mut self.tools, scratch, &*row.tools)?;
        for c in row.call_ids.iter() {
            self.call_ids.values().append_value(c);
        }
        self.call_ids.append(true);
        append_json(&mut self.trace_metadata, scratch, &row.trace_metadata)?;
        Ok(())
    }

    /// The finished columns, in schema order.
    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.schema_version.finish()),
            Arc::new(self.trace_id.finish()),
            Arc::new(self.session_id.finish()),
            Arc::new(self.task_id.finish()),
            Arc::new(self.group_id.finish()),
            Arc::new(self.attempt.finish()),
            Arc::new(self.policy_version.finish()),
            Arc::new(self.weight_version.finish()),
            Arc::new(self.status.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.builder.finish()),
            Arc::new(self.trace_index.finish()),
            Arc::new(self.chain.finish()),
            Arc::new(self.chain_role.finish()),
            Arc::new(self.segment.finish()),
            Arc::new(self.segment_kind.finish()),
            Arc::new(self.break_reason.finish()),
            Arc::new(self.labels.finish()),
            Arc::new(self.finish_reason.finish()),
            Arc::new(self.reward.finish()),
            Arc::new(self.prompt_ids.finish()),
            Arc::new(self.response_ids.finish()),
            Arc::new(self.loss_mask.finish()),
            Arc::new(self.logprobs.finish()),
            Arc::new(self.prompt_messages.finish()),
            Arc::new(self.response_messages.finish()),
            Arc::new(self.tools.finish()),
            Arc::new(self.call_ids.finish()),
            Arc::new(self.trace_metadata.finish()),
            Arc::new(self.trajectory_metadata.finish()),
            Arc::new(self.stats.finish()),
            Arc::new(self.off_policy_context_tokens.finish()),
        ]
    }
}

fn schema_error(detail: String) -> ExportError {
    ExportError::Schema {
        version: EXPORT_SCHEMA_VERSION,
        detail,
    }
}

/// Typed access to a batch's columns by name.
struct Columns<'b>(&'b RecordBatch);

impl<'b> Columns<'b> {
    fn get<T: Array + 'static>(&self, name: &str) -> Result<&'b T, ExportError> {
        self.0
            .column_by_name(name)
            .ok_or_else(|| schema_error(format!("no column {name}")))?
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| schema_error(format!("column {name} has the wrong type")))
    }

    fn string(&self, name: &'static str) -> Result<StringCol<'b>, ExportError> {
        Ok(StringCol(name, self.get::<StringArray>(name)?))
    }

    /// A string column added to the layout after files of its version were
    /// written: absent in those (every value null).
    fn added_string(&self, name: &'static str) -> Result<Option<StringCol<'b>>, ExportError> {
        Ok(self.added::<StringArray>(name)?.map(|a| StringCol(name, a)))
    }

    /// A column added to the layout after files of its version were
    /// written: absent in those (every value null).
    fn added<T: Array + 'static>(&self, name: &str) -> Result<Option<&'b T>, ExportError> {
        match self.0.column_by_name(name) {
            None => Ok(None),
            Some(_) => self.get::<T>(name).map(Some),
        }
    }

    fn list<P: ArrowPrimitiveType>(
        &self,
        name: &'static str,
    ) -> Result<ListCol<'b, P>, ExportError> {
        let list = self.get::<ListArray>(name)?;
        let values = list
            .values()
            .as_any()
            .downcast_ref::<PrimitiveArray<P>>()
            .ok_or_else(|| schema_error(format!("column {name} has the wrong item type")))?;
        Ok(ListCol(list, values))
    }

    fn string_list(&self, name: &'static str) -> Result<StringListCol<'b>, ExportError> {
        let list = self.get::<ListArray>(name)?;
        let values = list
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| schema_error(format!("column {name} has the wrong item type")))?;
        Ok(StringListCol(list, values))
    }
}

struct StringCol<'b>(&'static str, &'b StringArray);

impl<'b> StringCol<'b> {
    fn opt(&self, i: usize) -> Option<&'b str> {
        (!self.1.is_null(i)).then(|| self.1.value(i))
    }

    fn req(&self, i: usize) -> Result<&'b str, ExportError> {
        self.opt(i)
            .ok_or_else(|| schema_error(format!("column {} is null in row {i}", self.0)))
    }

    fn json<T: serde::de::DeserializeOwned>(&self, i: usize) -> Result<T, ExportError> {
        serde_json::from_str(self.req(i)?)
            .map_err(|e| schema_error(format!("column {} row {i}: {e}", self.0)))
    }
}

struct ListCol<'b, P: ArrowPrimitiveType>(&'b ListArray, &'b PrimitiveArray<P>);

impl<'b, P: ArrowPrimitiveType> ListCol<'b, P> {
    fn opt(&self, i: usize) -> Option<&'b [P::Native]> {
        if self.0.is_null(i) {
            return None;
        }
        let offsets = self.0.value_offsets();
        let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
        Some(&self.1.values()[start..end])
    }
}

struct StringListCol<'b>(&'b ListArray, &'b StringArray);

impl StringListCol<'_> {
    fn values(&self, i: usize) -> Vec<String> {
        if self.0.is_null(i) {
            return Vec::new();
        }
        let offsets = self.0.value_offsets();
        (offsets[i] as usize..offsets[i + 1] as usize)
            .map(|j| self.1.value(j).to_owned())
            .collect()
    }
}

/// Reads the rows of a batch of the export schema.
pub fn batch_rows(batch: &RecordBatch) -> Result<Vec<Row<'static>>, ExportError> {
    let c = Columns(batch);
    let schema_version = c.get::<UInt32Array>("schema_version")?;
    let trace_id = c.string("trace_id")?;
    let session_id = c.string("session_id")?;
    let task_id = c.string("task_id")?;
    let group_id = c.string("group_id")?;
    let attempt = c.added::<UInt32Array>("attempt")?;
    let policy_version = c.string("policy_version")?;
    let weight_version = c.added_string("weight_version")?;
    let status = c.string("status")?;
    let error = c.string("error")?;
    let builder = c.string("builder")?;
    let trace_index = c.get::<UInt32Array>("trace_index")?;
    let chain = c.get::<UInt32Array>("chain")?;
    let chain_role = c.added_string("chain_role")?;
    let segment = c.get::<UInt32Array>("segment")?;
    let segment_kind = c.string("segment_kind")?;
    let break_reason = c.string("break_reason")?;
    let labels = c.string_list("labels")?;
    let finish_reason = c.string("finish_reason")?;
    let reward = c.get::<Float64Array>("reward")?;
    let prompt_ids = c.list::<arrow_array::types::UInt32Type>("prompt_ids")?;
    let response_ids = c.list::<arrow_array::types::UInt32Type>("response_ids")?;
    let loss_mask = c.list::<arrow_array::types::UInt8Type>("loss_mask")?;
    let logprobs = c.list::<arrow_array::types::Float32Type>("response_logprobs")?;
    let prompt_messages = c.string("prompt_messages")?;
    let response_messages = c.string("response_messages")?;
    let tools = c.string("tools")?;
    let call_ids = c.string_list("call_ids")?;
    let trace_metadata = c.string("trace_metadata")?;
    let trajectory_metadata = c.string("trajectory_metadata")?;
    let stats = c.string("stats")?;
    let off_policy = c.added::<UInt32Array>("off_policy_context_tokens")?;

    let owned = |s: Option<&str>| s.map(|s| Cow::Owned(s.to_owned()));
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let labels = labels
            .values(i)
            .iter()
            .map(|l| parse_name("labels", l))
            .collect::<Result<Vec<_>, _>>()?;
        let extras: TraceExtras<'static> = trace_metadata.json(i)?;
        out.push(Row {
            schema_version: schema_version.value(i),
            trace_id: trace_id.req(i)?.to_owned(),
            session_id: Cow::Owned(session_id.req(i)?.to_owned()),
            task_id: owned(task_id.opt(i)),
            group_id: owned(group_id.opt(i)),
            attempt: attempt.and_then(|a| (!a.is_null(i)).then(|| a.value(i))),
            policy_version: owned(policy_version.opt(i)),
            weight_version: owned(weight_version.as_ref().and_then(|c| c.opt(i))),
            status: parse_name("status", status.req(i)?)?,
            error: owned(error.opt(i)),
            builder: Cow::Owned(builder.req(i)?.to_owned()),
            trace_index: trace_index.value(i),
            chain: chain.value(i),
            chain_role: chain_role
                .as_ref()
                .and_then(|c| c.opt(i))
                .map(|r| parse_name("chain_role", r))
                .transpose()?
                .unwrap_or_default(),
            segment: segment.value(i),
            segment_kind: Cow::Owned(segment_kind.req(i)?.to_owned()),
            break_reason: break_reason
                .opt(i)
                .map(|r| parse_name("break_reason", r))
                .transpose()?,
            labels: Cow::Owned(labels),
            finish_reason: owned(finish_reason.opt(i)),
            reward: (!reward.is_null(i)).then(|| reward.value(i)),
            prompt_ids: Cow::Owned(prompt_ids.opt(i).unwrap_or_default().to_vec()),
            response_ids: Cow::Owned(response_ids.opt(i).unwrap_or_default().to_vec()),
            loss_mask: Cow::Owned(loss_mask.opt(i).unwrap_or_default().to_vec()),
            response_logprobs: logprobs.opt(i).map(|l| Cow::Owned(l.to_vec())),
            prompt_messages: Cow::Owned(prompt_messages.json(i)?),
            response_messages: Cow::Owned(response_messages.json(i)?),
            tools: Cow::Owned(tools.json(i)?),
            call_ids: Cow::Owned(call_ids.values(i)),
            trace_metadata: extras,
            trajectory_metadata: Cow::Owned(trajectory_metadata.json(i)?),
            stats: Cow::Owned(stats.json(i)?),
            off_policy_context_tokens: off_policy.and_then(|a| (!a.is_null(i)).then(|| a.value(i))),
        });
    }
    Ok(out)
}
