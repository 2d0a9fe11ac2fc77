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
use super::row::{Row, TraceExtras, break_reason_name, label_name, parse_name, rows, status_name};
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
    let n = traj.traces.len();
    let prompt_tokens: usize = traj.traces.iter().map(|t| t.prompt_ids.len()).sum();
    let response_tokens: usize = traj.traces.iter().map(|t| t.response_ids.len()).sum();
    let mut scratch = Vec::new();
    let strings = || StringBuilder::with_capacity(n, 16 * n);

    let mut schema_version = UInt32Builder::with_capacity(n);
    let mut trace_id = strings();
    let mut session_id = strings();
    let mut task_id = strings();
    let mut group_id = strings();
    let mut policy_version = strings();
    let mut status = strings();
    let mut error = strings();
    let mut builder = strings();
    let mut trace_index = UInt32Builder::with_capacity(n);
    let mut chain = UInt32Builder::with_capacity(n);
    let mut segment = UInt32Builder::with_capacity(n);
    let mut segment_kind = strings();
    let mut break_reason = strings();
    let mut labels = list(strings(), DataType::Utf8, n);
    let mut finish_reason = strings();
    let mut reward = Float64Builder::with_capacity(n);
    let mut prompt_ids = list(
        UInt32Builder::with_capacity(prompt_tokens),
        DataType::UInt32,
        n,
    );
    let mut response_ids = list(
        UInt32Builder::with_capacity(response_tokens),
        DataType::UInt32,
        n,
    );
    let mut loss_mask = list(
        UInt8Builder::with_capacity(response_tokens),
        DataType::UInt8,
        n,
    );
    let mut logprobs = list(
        Float32Builder::with_capacity(response_tokens),
        DataType::Float32,
        n,
    );
    let mut prompt_messages = strings();
    let mut response_messages = strings();
    let mut tools = strings();
    let mut call_ids = list(strings(), DataType::Utf8, n);
    let mut trace_metadata = strings();
    let mut trajectory_metadata = strings();
    let mut stats = strings();

    let traj_md_json = serde_json::to_string(&traj.metadata)?;
    let stats_json = serde_json::to_string(&traj.stats)?;

    for row in rows(traj) {
        schema_version.append_value(row.schema_version);
        trace_id.append_value(&row.trace_id);
        session_id.append_value(&row.session_id);
        task_id.append_option(row.task_id.as_deref());
        group_id.append_option(row.group_id.as_deref());
        policy_version.append_option(row.policy_version.as_deref());
        status.append_value(status_name(row.status));
        error.append_option(row.error.as_deref());
        builder.append_value(&row.builder);
        trace_index.append_value(row.trace_index);
        chain.append_value(row.chain);
        segment.append_value(row.segment);
        segment_kind.append_value(&row.segment_kind);
        break_reason.append_option(row.break_reason.map(break_reason_name));
        for l in row.labels.iter() {
            labels.values().append_value(label_name(*l));
        }
        labels.append(true);
        finish_reason.append_option(row.finish_reason.as_deref());
        reward.append_option(row.reward);
        prompt_ids.values().append_slice(&row.prompt_ids);
        prompt_ids.append(true);
        response_ids.values().append_slice(&row.response_ids);
        response_ids.append(true);
        loss_mask.values().append_slice(&row.loss_mask);
        loss_mask.append(true);
        match &row.response_logprobs {
            Some(l) => {
                logprobs.values().append_slice(l);
                logprobs.append(true);
            }
            None => logprobs.append(false),
        }
        append_json(&mut prompt_messages, &mut scratch, &*row.prompt_messages)?;
        append_json(
            &mut response_messages,
            &mut scratch,
            &*row.response_messages,
        )?;
        append_json(&mut tools, &mut scratch, &*row.tools)?;
        for c in row.call_ids.iter() {
            call_ids.values().append_value(c);
        }
        call_ids.append(true);
        append_json(&mut trace_metadata, &mut scratch, &row.trace_metadata)?;
        trajectory_metadata.append_value(&traj_md_json);
        stats.append_value(&stats_json);
    }

    let columns: Vec<ArrayRef> = vec![
        Arc::new(schema_version.finish()),
        Arc::new(trace_id.finish()),
        Arc::new(session_id.finish()),
        Arc::new(task_id.finish()),
        Arc::new(group_id.finish()),
        Arc::new(policy_version.finish()),
        Arc::new(status.finish()),
        Arc::new(error.finish()),
        Arc::new(builder.finish()),
        Arc::new(trace_index.finish()),
        Arc::new(chain.finish()),
        Arc::new(segment.finish()),
        Arc::new(segment_kind.finish()),
        Arc::new(break_reason.finish()),
        Arc::new(labels.finish()),
        Arc::new(finish_reason.finish()),
        Arc::new(reward.finish()),
        Arc::new(prompt_ids.finish()),
        Arc::new(response_ids.finish()),
        Arc::new(loss_mask.finish()),
        Arc::new(logprobs.finish()),
        Arc::new(prompt_messages.finish()),
        Arc::new(response_messages.finish()),
        Arc::new(tools.finish()),
        Arc::new(call_ids.finish()),
        Arc::new(trace_metadata.finish()),
        Arc::new(trajectory_metadata.finish()),
        Arc::new(stats.finish()),
    ];
    Ok(RecordBatch::try_new(arrow_schema(), columns)?)
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
    let policy_version = c.string("policy_version")?;
    let status = c.string("status")?;
    let error = c.string("error")?;
    let builder = c.string("builder")?;
    let trace_index = c.get::<UInt32Array>("trace_index")?;
    let chain = c.get::<UInt32Array>("chain")?;
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
            policy_version: owned(policy_version.opt(i)),
            status: parse_name("status", status.req(i)?)?,
            error: owned(error.opt(i)),
            builder: Cow::Owned(builder.req(i)?.to_owned()),
            trace_index: trace_index.value(i),
            chain: chain.value(i),
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
        });
    }
    Ok(out)
}
